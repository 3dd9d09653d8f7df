"""vLLM's runtime adapter bodies. router/lora_runtime.py checks the values (names, paths under
--lora-dir) and answers 400s in vLLM's words; these declare the shape for GET /openapi.json."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from router.lora_paths import MAX_LORA_PATH_BYTES
from shard.lora.names import MAX_ADAPTER_NAME_CHARS


class UnloadLoraAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(
        min_length=1,
        max_length=MAX_ADAPTER_NAME_CHARS,
        description="The adapter's name, as requests will use it (printable characters, none "
        "of `,= `)",
    )


class LoadLoraAdapter(UnloadLoraAdapter):
    lora_path: str = Field(
        min_length=1,
        max_length=MAX_LORA_PATH_BYTES,
        description=f"A PEFT adapter directory under --lora-dir; at most {MAX_LORA_PATH_BYTES} "
        "bytes",
    )
