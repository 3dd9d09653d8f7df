from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model_id", "dtype", "device_type", "block_size", "world_size", "vocab_size", "max_position_embeddings", "attention_impl", "eos_token_ids", "rope_regime_boundary", "draft_model_id", "recurrent_state")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_TYPE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_POSITION_EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_IMPL_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ROPE_REGIME_BOUNDARY_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    RECURRENT_STATE_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    dtype: str
    device_type: str
    block_size: int
    world_size: int
    vocab_size: int
    max_position_embeddings: int
    attention_impl: str
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    rope_regime_boundary: int
    draft_model_id: str
    recurrent_state: bool
    def __init__(self, model_id: _Optional[str] = ..., dtype: _Optional[str] = ..., device_type: _Optional[str] = ..., block_size: _Optional[int] = ..., world_size: _Optional[int] = ..., vocab_size: _Optional[int] = ..., max_position_embeddings: _Optional[int] = ..., attention_impl: _Optional[str] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., rope_regime_boundary: _Optional[int] = ..., draft_model_id: _Optional[str] = ..., recurrent_state: _Optional[bool] = ...) -> None: ...

class ServiceDiscoveryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServiceDiscoveryResponse(_message.Message):
    __slots__ = ("urls",)
    URLS_FIELD_NUMBER: _ClassVar[int]
    urls: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, urls: _Optional[_Iterable[str]] = ...) -> None: ...

class ClearCacheRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class ClearCacheResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NextTokenChooserParameters(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "typical_p", "do_sample", "seed", "repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias", "min_p")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TYPICAL_P_FIELD_NUMBER: _ClassVar[int]
    DO_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    typical_p: float
    do_sample: bool
    seed: int
    repetition_penalty: float
    frequency_penalty: float
    presence_penalty: float
    logit_bias: _containers.ScalarMap[int, float]
    min_p: float
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., typical_p: _Optional[float] = ..., do_sample: _Optional[bool] = ..., seed: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., min_p: _Optional[float] = ...) -> None: ...

class StoppingCriteriaParameters(_message.Message):
    __slots__ = ("max_new_tokens", "ignore_eos_token")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    ignore_eos_token: bool
    def __init__(self, max_new_tokens: _Optional[int] = ..., ignore_eos_token: _Optional[bool] = ...) -> None: ...

class Request(_message.Message):
    __slots__ = ("id", "input_ids", "parameters", "stopping_parameters", "prefill_logprobs", "top_n_tokens", "adapter_id", "blocks", "slots", "prefix_len", "constrained")
    ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    STOPPING_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_N_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_LEN_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINED_FIELD_NUMBER: _ClassVar[int]
    id: int
    input_ids: _containers.RepeatedScalarFieldContainer[int]
    parameters: NextTokenChooserParameters
    stopping_parameters: StoppingCriteriaParameters
    prefill_logprobs: bool
    top_n_tokens: int
    adapter_id: str
    blocks: _containers.RepeatedScalarFieldContainer[int]
    slots: _containers.RepeatedScalarFieldContainer[int]
    prefix_len: int
    constrained: bool
    def __init__(self, id: _Optional[int] = ..., input_ids: _Optional[_Iterable[int]] = ..., parameters: _Optional[_Union[NextTokenChooserParameters, _Mapping]] = ..., stopping_parameters: _Optional[_Union[StoppingCriteriaParameters, _Mapping]] = ..., prefill_logprobs: _Optional[bool] = ..., top_n_tokens: _Optional[int] = ..., adapter_id: _Optional[str] = ..., blocks: _Optional[_Iterable[int]] = ..., slots: _Optional[_Iterable[int]] = ..., prefix_len: _Optional[int] = ..., constrained: _Optional[bool] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("id", "requests", "size", "max_tokens", "max_blocks")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    id: int
    requests: _containers.RepeatedCompositeFieldContainer[Request]
    size: int
    max_tokens: int
    max_blocks: int
    def __init__(self, id: _Optional[int] = ..., requests: _Optional[_Iterable[_Union[Request, _Mapping]]] = ..., size: _Optional[int] = ..., max_tokens: _Optional[int] = ..., max_blocks: _Optional[int] = ...) -> None: ...

class CachedBatch(_message.Message):
    __slots__ = ("id", "request_ids", "size", "max_tokens")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    id: int
    request_ids: _containers.RepeatedScalarFieldContainer[int]
    size: int
    max_tokens: int
    def __init__(self, id: _Optional[int] = ..., request_ids: _Optional[_Iterable[int]] = ..., size: _Optional[int] = ..., max_tokens: _Optional[int] = ...) -> None: ...

class Tokens(_message.Message):
    __slots__ = ("ids", "logprobs")
    IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class Generation(_message.Message):
    __slots__ = ("request_id", "prefill_tokens", "tokens", "top_tokens", "prefill_top_tokens", "draft_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    prefill_tokens: Tokens
    tokens: Tokens
    top_tokens: _containers.RepeatedCompositeFieldContainer[Tokens]
    prefill_top_tokens: _containers.RepeatedCompositeFieldContainer[Tokens]
    draft_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[int] = ..., prefill_tokens: _Optional[_Union[Tokens, _Mapping]] = ..., tokens: _Optional[_Union[Tokens, _Mapping]] = ..., top_tokens: _Optional[_Iterable[_Union[Tokens, _Mapping]]] = ..., prefill_top_tokens: _Optional[_Iterable[_Union[Tokens, _Mapping]]] = ..., draft_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class FilterBatchRequest(_message.Message):
    __slots__ = ("batch_id", "request_ids")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    request_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, batch_id: _Optional[int] = ..., request_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class FilterBatchResponse(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: CachedBatch
    def __init__(self, batch: _Optional[_Union[CachedBatch, _Mapping]] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("batch", "cached_batches", "prefill_chunks", "token_masks", "proposals", "draft_tokens")
    class PrefillChunksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class TokenMasksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: bytes
        def __init__(self, key: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...
    class ProposalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: Proposal
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[Proposal, _Mapping]] = ...) -> None: ...
    BATCH_FIELD_NUMBER: _ClassVar[int]
    CACHED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    PREFILL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_MASKS_FIELD_NUMBER: _ClassVar[int]
    PROPOSALS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    batch: Batch
    cached_batches: _containers.RepeatedCompositeFieldContainer[CachedBatch]
    prefill_chunks: _containers.ScalarMap[int, int]
    token_masks: _containers.ScalarMap[int, bytes]
    proposals: _containers.MessageMap[int, Proposal]
    draft_tokens: int
    def __init__(self, batch: _Optional[_Union[Batch, _Mapping]] = ..., cached_batches: _Optional[_Iterable[_Union[CachedBatch, _Mapping]]] = ..., prefill_chunks: _Optional[_Mapping[int, int]] = ..., token_masks: _Optional[_Mapping[int, bytes]] = ..., proposals: _Optional[_Mapping[int, Proposal]] = ..., draft_tokens: _Optional[int] = ...) -> None: ...

class Proposal(_message.Message):
    __slots__ = ("ids", "token_masks")
    IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_MASKS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    token_masks: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., token_masks: _Optional[_Iterable[bytes]] = ...) -> None: ...

class LoraStats(_message.Message):
    __slots__ = ("slots_in_use", "host_cache_hits", "host_cache_misses", "host_cache_evictions")
    SLOTS_IN_USE_FIELD_NUMBER: _ClassVar[int]
    HOST_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    HOST_CACHE_MISSES_FIELD_NUMBER: _ClassVar[int]
    HOST_CACHE_EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    slots_in_use: int
    host_cache_hits: int
    host_cache_misses: int
    host_cache_evictions: int
    def __init__(self, slots_in_use: _Optional[int] = ..., host_cache_hits: _Optional[int] = ..., host_cache_misses: _Optional[int] = ..., host_cache_evictions: _Optional[int] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("generations", "batch", "forward_ns", "decode_ns", "total_ns", "lora", "adapter_failures")
    GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    FORWARD_NS_FIELD_NUMBER: _ClassVar[int]
    DECODE_NS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FAILURES_FIELD_NUMBER: _ClassVar[int]
    generations: _containers.RepeatedCompositeFieldContainer[Generation]
    batch: CachedBatch
    forward_ns: int
    decode_ns: int
    total_ns: int
    lora: LoraStats
    adapter_failures: _containers.RepeatedCompositeFieldContainer[AdapterFailure]
    def __init__(self, generations: _Optional[_Iterable[_Union[Generation, _Mapping]]] = ..., batch: _Optional[_Union[CachedBatch, _Mapping]] = ..., forward_ns: _Optional[int] = ..., decode_ns: _Optional[int] = ..., total_ns: _Optional[int] = ..., lora: _Optional[_Union[LoraStats, _Mapping]] = ..., adapter_failures: _Optional[_Iterable[_Union[AdapterFailure, _Mapping]]] = ...) -> None: ...

class AdapterFailure(_message.Message):
    __slots__ = ("adapter_id", "reason", "request_ids")
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    reason: str
    request_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, adapter_id: _Optional[str] = ..., reason: _Optional[str] = ..., request_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = ("batches", "prefill_chunks", "token_masks", "proposals", "draft_tokens")
    class PrefillChunksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class TokenMasksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: bytes
        def __init__(self, key: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...
    class ProposalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: Proposal
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[Proposal, _Mapping]] = ...) -> None: ...
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    PREFILL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_MASKS_FIELD_NUMBER: _ClassVar[int]
    PROPOSALS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[CachedBatch]
    prefill_chunks: _containers.ScalarMap[int, int]
    token_masks: _containers.ScalarMap[int, bytes]
    proposals: _containers.MessageMap[int, Proposal]
    draft_tokens: int
    def __init__(self, batches: _Optional[_Iterable[_Union[CachedBatch, _Mapping]]] = ..., prefill_chunks: _Optional[_Mapping[int, int]] = ..., token_masks: _Optional[_Mapping[int, bytes]] = ..., proposals: _Optional[_Mapping[int, Proposal]] = ..., draft_tokens: _Optional[int] = ...) -> None: ...

class DecodeResponse(_message.Message):
    __slots__ = ("generations", "batch", "concat_ns", "forward_ns", "decode_ns", "total_ns", "lora")
    GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    CONCAT_NS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_NS_FIELD_NUMBER: _ClassVar[int]
    DECODE_NS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    generations: _containers.RepeatedCompositeFieldContainer[Generation]
    batch: CachedBatch
    concat_ns: int
    forward_ns: int
    decode_ns: int
    total_ns: int
    lora: LoraStats
    def __init__(self, generations: _Optional[_Iterable[_Union[Generation, _Mapping]]] = ..., batch: _Optional[_Union[CachedBatch, _Mapping]] = ..., concat_ns: _Optional[int] = ..., forward_ns: _Optional[int] = ..., decode_ns: _Optional[int] = ..., total_ns: _Optional[int] = ..., lora: _Optional[_Union[LoraStats, _Mapping]] = ...) -> None: ...

class WarmupRequest(_message.Message):
    __slots__ = ("batch", "max_input_tokens", "max_total_tokens", "max_prefill_tokens", "max_batch_total_tokens", "max_batch_size")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    batch: Batch
    max_input_tokens: int
    max_total_tokens: int
    max_prefill_tokens: int
    max_batch_total_tokens: int
    max_batch_size: int
    def __init__(self, batch: _Optional[_Union[Batch, _Mapping]] = ..., max_input_tokens: _Optional[int] = ..., max_total_tokens: _Optional[int] = ..., max_prefill_tokens: _Optional[int] = ..., max_batch_total_tokens: _Optional[int] = ..., max_batch_size: _Optional[int] = ...) -> None: ...

class WarmupResponse(_message.Message):
    __slots__ = ("max_supported_total_tokens", "num_blocks", "max_batch_size")
    MAX_SUPPORTED_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    max_supported_total_tokens: int
    num_blocks: int
    max_batch_size: int
    def __init__(self, max_supported_total_tokens: _Optional[int] = ..., num_blocks: _Optional[int] = ..., max_batch_size: _Optional[int] = ...) -> None: ...

class LoadAdapterRequest(_message.Message):
    __slots__ = ("name", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class LoadAdapterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnloadAdapterRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UnloadAdapterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
