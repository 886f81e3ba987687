"""Training: LoRA SFT and DPO from a typed config, with packing, attention, fused loss, logs and export.

Holds the config (`trainconfig.py`), the SFT recipe (`train.py`) and DPO (`dpo.py`), batching
(`packing.py`), attention and loss kernels (`attention.py`, `fused.py`, `lmloss.py`), the training log
(`trainlog.py`) and merging an adapter for serving (`export.py`). May import: `agentrig.data` (rendering,
the data card) and the top-level helpers; never policies or evaluation. torch, transformers and peft are
imported inside the functions that need them, so importing this package stays light.
"""
