"""Builds a ready-to-serve shard: device, process group, model, runner and servicer."""

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from shard.attention import get_attention_backend
from shard.distributed import init_distributed
from shard.draft import DraftModel
from shard.faults import Faults
from shard.kv_cache import KvCacheSettings
from shard.layers.lora import LoraStep
from shard.layers.moe import FusedMoE
from shard.layers.quant.base import LinearWeight
from shard.layers.quant.unquantized import DenseWeight
from shard.lora.manager import LoraManager, LoraSettings
from shard.models import load_model
from shard.models.config import UnsupportedArchitectureError, read_quantization
from shard.models.sparse_attention import SparseLatentAttention
from shard.platforms import platform_of, shard_device
from shard.platforms.cpu.compiled import CompiledForward, check_supported
from shard.platforms.cpu.decode_loop import CpuDecodePath
from shard.platforms.cuda.graphs import DecodeGraphs, buckets_for
from shard.rank_env import DistributedEnv
from shard.runner import ModelRunner
from shard.sampling.graph_heads import SamplingHeads
from shard.server import ShardIdentity, TextGenerationService
from shard.settings import DTYPES, ShardSettings
from shard.steps_ahead import overlap_enabled

log = logging.getLogger(__name__)


def auto_dtype(model_dir: Path, device: torch.device) -> torch.dtype:
    """`--dtype auto`: the checkpoint's dtype, except for int4 checkpoints where the platform's
    int4 kernel takes one activation dtype only (bfloat16: the CPU's, see quant/int4_cpu.py, and
    CUDA's tinygemm for decode, quant/int4_cuda.py)."""
    int4_dtype = platform_of(device).int4_activation_dtype
    quantization = read_quantization(model_dir)
    if int4_dtype is not None and quantization is not None and quantization.int4_linears:
        return int4_dtype
    return checkpoint_dtype(model_dir)


def check_quantize_flag(quantize: str | None, model_dir: Path) -> None:
    found = read_quantization(model_dir)
    if quantize == "fp8" and found is None:
        return  # quantized at load (shard/layers/quant/fp8_online.py)
    if quantize is not None and (found is None or found.method != quantize):
        raise ValueError(
            f"--quantize {quantize} disagrees with {model_dir}, which is "
            f"{found.method if found else 'not quantized'} (config.json quantization_config)"
        )


def checkpoint_dtype(model_dir: Path) -> torch.dtype:
    """The dtype the checkpoint was saved in; float32 when it does not say."""
    config = json.loads((model_dir / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    if name not in DTYPES:
        raise ValueError(f"checkpoint dtype {name!r} is not supported; pass --dtype explicitly")
    return DTYPES[name]


def build_service(
    settings: ShardSettings, torch_thread: ThreadPoolExecutor | None = None
) -> TextGenerationService:
    """Loads the model on `torch_thread` (a new one when None), the thread every step runs on."""
    torch_thread = torch_thread or ThreadPoolExecutor(1, thread_name_prefix="torch")
    return torch_thread.submit(_build_service, settings, torch_thread).result()


def _build_service(
    settings: ShardSettings, torch_thread: ThreadPoolExecutor
) -> TextGenerationService:
    env = DistributedEnv.from_env()
    device = shard_device(env.local_rank)
    platform = platform_of(device)
    platform.threads(env.world_size)
    dist = init_distributed(device)
    model_dir = Path(settings.model_id)
    check_quantize_flag(settings.quantize, model_dir)
    dtype = auto_dtype(model_dir, device) if settings.dtype == "auto" else DTYPES[settings.dtype]
    # Triton kernels on GPUs; on CPU they only run interpreted (TRITON_INTERPRET=1), for tests.
    attention = settings.attention or platform.default_attention
    log.info(
        "loading %s as %s on %s with %s attention (rank %d of %d)",
        model_dir, dtype, device, attention, env.rank, env.world_size,
    )  # fmt: skip
    model = load_model(
        model_dir, dtype=dtype, device=device, dist=dist, attention=attention,
        expert_parallel=settings.expert_parallel, quantize=settings.quantize,
    )  # fmt: skip
    platform.warm(attention)
    lora = None
    if settings.enable_lora or settings.lora_adapters:
        lora_settings = LoraSettings(
            adapters={name: Path(path) for name, path in settings.lora_adapters},
            max_loras=settings.max_loras,
            max_cpu_loras=settings.max_cpu_loras,
            max_rank=settings.max_lora_rank,
        )
        lora = LoraManager(model, lora_settings, triton=attention == "triton", dist=dist)
        names = ", ".join(lora.names) or "none yet"
        log.info("LoRA adapters: %s (%d slots)", names, settings.max_loras)
    forward = decode_path = None
    if settings.compile:
        forward = compiled_forward(model, attention, device, env.world_size)
    else:
        decode_path = CpuDecodePath.build(model, lora.step if lora else None)
    graphs = decode_graphs(
        model,
        device,
        settings.cuda_graphs,
        lora.step if lora else None,
        settings.block_size,
        env.world_size,
    )
    draft = None
    if settings.draft_model is not None:
        sizes = graphs.sizes if graphs is not None else ()
        draft = load_draft(settings, model, dist, device, attention, sizes)
    runner = ModelRunner(
        model, dist, device, settings.block_size, lora.step if lora else None, forward,
        decode_path, graphs, draft,
    )  # fmt: skip
    identity = ShardIdentity(
        model_id=settings.model_id,
        dtype=str(dtype).removeprefix("torch."),
        uds_path=settings.uds_path,
        attention=attention,
    )
    kv_settings = KvCacheSettings(
        block_size=settings.block_size,
        cuda_memory_fraction=settings.cuda_memory_fraction,
        cpu_kv_cache_gb=settings.cpu_kv_cache_gb,
    )
    faults = Faults.from_env(env.rank)
    if faults is not None:
        log.warning("faults will be injected on purpose: %s", faults)
    overlap = overlap_enabled(settings, device)
    if overlap:
        log.info("overlap scheduling: each decode step's successor is queued ahead")
    return TextGenerationService(
        runner, identity, kv_settings, torch_thread, lora, faults, overlap=overlap
    )


def load_draft(
    settings: ShardSettings,
    model: torch.nn.Module,
    dist,
    device: torch.device,
    attention: str,
    graph_sizes: tuple[int, ...] = (),
) -> DraftModel:
    """--draft-model: loaded as the model is, sharded over the same ranks; its own checkpoint
    decides its quantization and, under --dtype auto, its dtype (an int4 draft beside a bf16 or
    fp16 model takes the platform's int4 activation dtype); with decode graphs of the model's
    buckets (`graph_sizes`) where the model has them."""
    assert settings.draft_model is not None
    draft_dir = Path(settings.draft_model)
    if settings.dtype == "auto":
        dtype = auto_dtype(draft_dir, device)
    else:
        dtype = DTYPES[settings.dtype]
    log.info("loading the draft model %s as %s", draft_dir, dtype)
    draft = load_model(draft_dir, dtype=dtype, device=device, dist=dist, attention=attention)
    if draft.vocab_size > model.vocab_size:
        raise UnsupportedArchitectureError(
            f"--draft-model {draft_dir}: its vocabulary ({draft.vocab_size} tokens) is larger "
            f"than the model's ({model.vocab_size}); the draft must share the model's tokenizer"
        )
    return DraftModel(
        draft, dist, device, settings.block_size, str(draft_dir), model.vocab_size,
        CpuDecodePath.build(draft, None), graph_sizes,
    )  # fmt: skip


def decode_graphs(
    model: torch.nn.Module,
    device: torch.device,
    asked: tuple[int, ...] | None,
    lora: LoraStep | None,
    block_size: int,
    world_size: int = 1,
) -> DecodeGraphs | None:
    """The decode steps' CUDA graphs (captured at Warmup), or None where there are none."""
    buckets = buckets_for(device, asked, world_size)
    if not buckets:
        return None
    return DecodeGraphs(model, buckets, device, lora, heads=SamplingHeads(model, block_size))


def compiled_forward(
    model: torch.nn.Module, attention: str, device: torch.device, world_size: int
) -> CompiledForward:
    """--compile's forward pass, or ValueError naming the flag when this shard cannot have it."""
    quantized = any(
        isinstance(m, LinearWeight) and not isinstance(m, DenseWeight) for m in model.modules()
    )
    experts = any(isinstance(m, FusedMoE) for m in model.modules())
    check_supported(
        world_size=world_size,
        device=device,
        attention=attention,
        quantized=quantized,
        experts=experts,
        recurrent=bool(getattr(model, "recurrent", False)),
        sparse_attention=any(isinstance(m, SparseLatentAttention) for m in model.modules()),
    )
    log.info("--compile: the forward pass is compiled with torch.compile (inductor) at warmup")
    return CompiledForward(model, get_attention_backend(attention))
