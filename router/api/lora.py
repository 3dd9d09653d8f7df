"""vLLM's runtime adapter bodies. router/lora_runtime.py checks the values (names, paths under
--lora-dir) and answers 400s in vLLM's words; these declare the shape for GET /openapi.json."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class UnloadLoraAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(description="The adapter's name, as requests will use it")


class LoadLoraAdapter(UnloadLoraAdapter):
    lora_path: str = Field(description="A PEFT adapter directory under --lora-dir")
