"""Real clients' tool loops against the server (fake shards that write what the grammar allows
first, or text once tools are no longer enforced): the `openai` client's, and an agent framework
(openai-agents) running two steps with `tool_choice: required`."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import pytest
from openai import AsyncOpenAI

from launcher.chat_families import family_tokenizer, save_family
from tests.router.harness import async_test, router_env
from tests.router.test_chat_tools import ALARM, HERMES, walking


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen")
    save_family("qwen", path)
    return path, family_tokenizer("qwen")


def openai_client(env) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=str(env.client.make_url("/v1")), api_key="unused", max_retries=0)


@async_test
async def test_openai_client_tool_loop(qwen):
    path, tok = qwen
    async with router_env(path, 1, walking(tok), **HERMES) as env:
        client = openai_client(env)
        messages = [{"role": "user", "content": "Wake me up early."}]
        first = await client.chat.completions.create(
            model=env.infer.model.model_id,
            messages=messages,
            tools=[ALARM],
            tool_choice="required",
            parallel_tool_calls=False,  # the fake shard's walk would go on writing calls
            max_tokens=100,
        )
        message = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls"
        (call,) = message.tool_calls
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, ALARM["function"]["parameters"])
        messages += [
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": f"set for {arguments['hour']}"},
        ]
        second = await client.chat.completions.create(
            model=env.infer.model.model_id, messages=messages, tools=[ALARM], max_tokens=6
        )
        assert second.choices[0].message.content and not second.choices[0].message.tool_calls
        # The history reached the model: the call and its result, in Qwen's format.
        prompt = tok.decode(env.shards[0].prefilled[-1].input_ids)
        assert '"name": "set_alarm"' in prompt and f"set for {arguments['hour']}" in prompt
        await client.close()


@async_test
async def test_agent_framework_two_step_tool_loop(qwen):
    """openai-agents calls the tool the server enforced, sends back its result, and gets the
    final answer (the SDK resets tool_choice after a call, so the second step is free text)."""
    # imported here, not at the top: the SDK takes ~3 s to import, which every test worker
    # would pay collecting this file
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # the SDK would otherwise try to upload traces to OpenAI
    path, tok = qwen
    calls: list[str] = []

    @function_tool
    def set_units(unit: Literal["celsius", "fahrenheit"]) -> str:
        """Choose the temperature unit."""
        calls.append(unit)
        return f"units set to {unit}"

    async with router_env(path, 1, walking(tok), **HERMES) as env:
        client = openai_client(env)
        agent = Agent(
            name="assistant",
            instructions="Use the tools.",
            tools=[set_units],
            model=OpenAIChatCompletionsModel(model=env.infer.model.model_id, openai_client=client),
            model_settings=ModelSettings(
                tool_choice="required", parallel_tool_calls=False, max_tokens=100
            ),
        )
        result = await Runner.run(agent, "Switch to metric.", max_turns=3)
        assert calls and calls[0] in ("celsius", "fahrenheit")
        assert isinstance(result.final_output, str) and result.final_output
        # The second request carried the call and its result back.
        prompt = tok.decode(env.shards[0].prefilled[-1].input_ids)
        assert f"units set to {calls[0]}" in prompt
        await client.close()
