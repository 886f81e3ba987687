"""A LangGraph agent on the trained adapter, served by `agentrig serve`, using datadesk's real tools.

    python examples/langgraph_agent.py --adapter runs/default/sft/adapter "How much OU-247 is on hand?"

starts the server in this process (the same one `agentrig serve --model smollm2-135m --adapter sft=DIR`
runs), points LangChain's OpenAI chat model at it, and runs LangGraph's prebuilt ReAct agent with datadesk's
tools, each executed for real against a fresh database (`datadesk.setup`). The server lists the tools in the
system prompt exactly as the harness did at training, so the adapter sees the prompt it was trained on.
With `--base-url` it talks to a server already running instead (agentrig serve, or vLLM with the commands in
docs/serving.md). A few minutes on 2 CPU cores with SmolLM2-135M; `run_agent` is what the test drives.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable


def langchain_tools(specs: list[dict[str, Any]], execute: Callable[[str, dict[str, Any]], str]) -> list[Any]:
    """LangChain tools with these OpenAI specs (name, description and JSON schema kept exactly), run by `execute`."""
    from langchain_core.tools import StructuredTool

    def bind(name: str) -> Callable[..., str]:
        return lambda **arguments: execute(name, arguments)

    return [StructuredTool.from_function(func=bind(s["function"]["name"]), name=s["function"]["name"],
                                         description=s["function"].get("description", ""),
                                         args_schema=s["function"].get("parameters") or {"type": "object", "properties": {}})
            for s in specs]


def run_agent(base_url: str, model: str, question: str, tools: list[Any], max_steps: int = 6) -> list[Any]:
    """Run LangGraph's ReAct agent on the served model; returns the conversation's messages."""
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    llm = ChatOpenAI(base_url=base_url, model=model, api_key="unused", temperature=0, max_tokens=256, max_retries=0)
    agent = create_react_agent(llm, tools)
    state = agent.invoke({"messages": [("user", question)]}, {"recursion_limit": 2 * max_steps + 1})
    return list(state["messages"])


def datadesk_tools() -> tuple[list[Any], Callable[[], None]]:
    """datadesk's seen tools on a fresh database, as LangChain tools (validated and run by the harness's ToolSet)."""
    from agentrig.envs import load_env
    from agentrig.evals.chat import session_tools
    from agentrig.harness.trajectory import ToolCall

    env = load_env("datadesk")
    toolset, state = session_tools(env)

    def execute(name: str, arguments: dict[str, Any]) -> str:
        errors = toolset.validate(name, arguments)
        if errors:
            return "Error: " + "; ".join(str(e) for e in errors)
        return toolset.execute(ToolCall(id="lc", name=name, arguments=arguments), timeout_s=10).content

    return langchain_tools(toolset.specs(), execute), lambda: env.close(state)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("question")
    ap.add_argument("--model", default="smollm2-135m", help="base model (with --base-url: the served model name)")
    ap.add_argument("--adapter", default=None, help="the trained adapter folder (served as 'sft')")
    ap.add_argument("--base-url", default=None, help="an OpenAI-compatible server already running (ends in /v1)")
    a = ap.parse_args()
    tools, close = datadesk_tools()
    running = None
    try:
        if a.base_url:
            url, name = a.base_url, a.model
        else:
            from agentrig.harness.loop import HarnessConfig
            from agentrig.serve.server import ServeConfig, build_state, start_server

            adapters = {"sft": a.adapter} if a.adapter else {}
            running = start_server(build_state(ServeConfig(model=a.model), adapters, HarnessConfig()))
            url, name = running.url, "sft" if a.adapter else a.model
        for message in run_agent(url, name, a.question, tools):
            calls = getattr(message, "tool_calls", None)
            shown = json.dumps([{c["name"]: c["args"]} for c in calls]) if calls else message.content
            print(f"[{message.type}] {shown}")
    finally:
        if running is not None:
            running.stop()
        close()


if __name__ == "__main__":
    main()
