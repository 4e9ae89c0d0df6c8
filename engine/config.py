"""Engine configuration: one slotted dataclass, checked on construction."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class EngineConfig:
    """Knobs of the engine. Bad values raise ``ValueError`` naming the field.

    Attributes:
        max_batch_size: most sequences in one step (running batch).
        max_wait_ms: longest time admission waits to gather a batch when the engine is idle. The scheduler
            shrinks the actual wait below this when requests arrive slowly (see ``Scheduler.batch_window_s``).
        max_num_batched_tokens: token budget of one step; longer prompts are prefilled in chunks.
        block_size: tokens per KV-cache block.
        kv_cache_bytes: memory for the KV-cache pool; ``None`` sizes it from free memory.
        kv_dtype: ``"auto"`` (the model's dtype), ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        max_waiting: most queued requests before ``submit`` raises ``CapacityError``.
        max_model_len: longest prompt plus reply; ``None`` takes the model's own limit.
        enable_prefix_caching: share full KV blocks between requests with the same prefix.
    """

    max_batch_size: int = 16
    max_wait_ms: float = 5.0
    max_num_batched_tokens: int = 512
    block_size: int = 16
    kv_cache_bytes: int | None = None
    kv_dtype: str = "auto"
    max_waiting: int = 256
    max_model_len: int | None = None
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")
        if self.max_num_batched_tokens < 16:
            raise ValueError(f"max_num_batched_tokens must be >= 16, got {self.max_num_batched_tokens}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise ValueError(f"kv_cache_bytes must be positive, got {self.kv_cache_bytes}")
        if self.kv_dtype not in ("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"):
            raise ValueError(f"kv_dtype must be auto, float32, bfloat16 or float16, got {self.kv_dtype!r}")
        if self.max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {self.max_waiting}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
