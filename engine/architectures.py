"""The model registry: every HF ``model_type`` the engine runs, with everything the engine knows about it.

One :class:`Architecture` entry per type holds its execution path, the features that change its shape or forward
pass, how llama.cpp lays it out in a GGUF file (:class:`GgufLayout`: tensor names, Q/K row permutation), the fields
of its tiny random test model, and, through the functions below, its parameter and KV-byte counts. Plain data and
small functions over a config (a ``dict`` from ``config.json`` or an HF config object): no torch and no
transformers, so every layer reads it (the import contracts place it just above ``engine.api``). The loader refuses
types that are not registered, the recommendation sizes weights and KV cache from these formulas, the GGUF readers
map tensor names with the layouts, and the runner picks its path.

Two execution paths share the KV pool and the paged attention:

* ``"fused"``: our own Llama-family decoder (``engine/model/llama.py``), with Q/K/V and gate/up fused into single
  matmuls. A config with a feature that decoder lacks (see :func:`execution_path`) falls back to the HF path.
* ``"hf"``: the model's own HF modules over the packed batch, with our paged attention registered as
  ``hearth_paged`` (``engine/model/attention.py``).

Every registered type has full attention; sliding-window configs are refused by the loader.

Adding a type is one entry in :data:`ARCHITECTURES`; ``tests/engine/model/test_correctness.py`` then builds a tiny random
model of it (when ``tiny`` is set) and compares it with HF.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ExecutionPath = Literal["fused", "hf"]
QkNorm = Literal["head", "full"]
AttentionBias = Literal["config", "qkv", "none"]

#: llama.cpp's name of each tensor of a Llama-family layer (``blk.N.<part>.weight``) -> HF's part
#: (``model.layers.N.<part>.weight``).
LLAMA_GGUF_LAYER: Mapping[str, str] = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}  # fmt: skip
#: llama.cpp's names of the tensors outside the layers -> HF's.
LLAMA_GGUF_TOP: Mapping[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class GgufLayout:
    """How llama.cpp's converter writes a type's tensors into a GGUF file whose ``general.architecture`` is the type.

    Attributes:
        permute_qk: the Q and K projections' rows are stored with each head's two rotary halves interleaved
            (llama.cpp does so for "llama"); :func:`qk_order` gives HF's order back.
        layer: a layer's tensor names, GGUF part -> HF part.
        top: the tensors outside the layers, GGUF name -> HF name.
    """

    permute_qk: bool = False
    layer: Mapping[str, str] = field(default_factory=lambda: LLAMA_GGUF_LAYER, hash=False)
    top: Mapping[str, str] = field(default_factory=lambda: LLAMA_GGUF_TOP, hash=False)

    def hf_name(self, gguf_name: str) -> str | None:
        """The HF parameter a GGUF tensor holds; None for tensors the engine does not read (e.g. rope tables)."""
        if gguf_name in self.top:
            return self.top[gguf_name]
        parts = gguf_name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in self.layer:
            return f"model.layers.{parts[1]}.{self.layer[parts[2]]}.{parts[3]}"
        return None

    def gguf_name(self, hf_name: str) -> str | None:
        """The GGUF tensor that holds an HF parameter (the inverse of :meth:`hf_name`); None when there is none."""
        for gguf, hf in self.top.items():
            if hf == hf_name:
                return gguf
        parts = hf_name.split(".")
        if len(parts) < 5 or parts[:2] != ["model", "layers"]:
            return None
        inner = ".".join(parts[3:-1])
        for gguf, hf in self.layer.items():
            if hf == inner:
                return f"blk.{parts[2]}.{gguf}.{parts[-1]}"
        return None

    def is_linear(self, gguf_name: str) -> bool:
        """Whether a GGUF tensor is one of a layer's linear weights (the matrices the int4/int8 kernels run)."""
        hf = self.hf_name(gguf_name)
        return hf is not None and hf.startswith("model.layers.") and hf.endswith("_proj.weight")


def qk_order(rows: int, heads: int) -> list[int]:
    """HF row i of a permuted Q/K projection is GGUF row ``order[i]`` (transformers' reverse permutation): within
    each head, llama.cpp interleaves the rows of the two rotary halves."""
    dim = rows // heads // 2
    return [h * 2 * dim + 2 * j + half for h in range(heads) for half in range(2) for j in range(dim)]


@dataclass(frozen=True, slots=True)
class Architecture:
    """One model type: its path, the features that change its shape or forward pass, its GGUF layout, its tests.

    Attributes:
        path: "fused" (our Llama-family decoder) or "hf" (the HF modules with our attention).
        tie_word_embeddings: whether the LM head shares the embedding when ``config.json`` does not say.
        attention_bias: "config": biases on Q/K/V/O when ``config.attention_bias`` says so; "qkv": on Q/K/V
            always (qwen2); "none": never.
        mlp_bias: the MLP has biases when ``config.mlp_bias`` says so (otherwise the type ignores that field).
        qk_norm: RMSNorm on queries and keys, per head ("head", qwen3) or over all heads ("full", olmo2).
        head_dim: the head size when the config leaves it out and it is not hidden size / heads (gemma: 256).
        gguf: the GGUF tensor layout, for types whose quantized blocks the engine reads itself (the native loader
            and the int4/int8 kernels); None: a GGUF of this type goes through transformers' GGUF loader.
        tiny: the config fields a tiny random model of this type sets beyond the tests' shared tiny shape
            (``tests/engine/conftest.py``); None: no tiny model of this type runs against HF in the tests.
    """

    path: ExecutionPath
    tie_word_embeddings: bool = False
    attention_bias: AttentionBias = "config"
    mlp_bias: bool = False
    qk_norm: QkNorm | None = None
    head_dim: int | None = None
    gguf: GgufLayout | None = None
    tiny: Mapping[str, Any] | None = field(default=None, hash=False)

    @property
    def tested(self) -> bool:
        """Whether a tiny random model of this type runs against HF in ``tests/engine``."""
        return self.tiny is not None


#: Every model type the engine runs: decoder-only transformers with full (not sliding-window) attention.
ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("fused", mlp_bias=True, gguf=GgufLayout(permute_qk=True), tiny={}),
    "mistral": Architecture("fused", attention_bias="none", tiny={"sliding_window": None}),
    "qwen2": Architecture("fused", attention_bias="qkv", gguf=GgufLayout(), tiny={}),
    "qwen3": Architecture("fused", qk_norm="head", head_dim=128, gguf=GgufLayout(), tiny={"head_dim": 16}),
    # HF path: phi3 has its own fused qkv_proj/gate_up_proj and partial rotary; gemma uses GELU and scales the
    # embedding; granite multiplies embedding, residuals and logits; olmo2 norms after attention and the MLP.
    "phi3": Architecture("hf", attention_bias="none"),
    "gemma": Architecture("hf", tie_word_embeddings=True, head_dim=256, tiny={"head_dim": 16}),
    "granite": Architecture("hf", mlp_bias=True),
    "olmo2": Architecture("hf", qk_norm="full"),
}

#: Types whose tiny random models the engine tests build and compare with HF, fused ones first.
TESTED_MODEL_TYPES: tuple[str, ...] = tuple(
    sorted((t for t, a in ARCHITECTURES.items() if a.tested), key=lambda t: ARCHITECTURES[t].path != "fused")
)


def gguf_layout(gguf_architecture: str) -> GgufLayout | None:
    """The tensor layout of a GGUF file by its ``general.architecture``; None when the engine does not read that
    layout's blocks itself."""
    arch = ARCHITECTURES.get(gguf_architecture)
    return None if arch is None else arch.gguf


def _get(config: Any, name: str, default: Any = None) -> Any:
    """A config field from a dict or an HF config object; ``default`` when absent or None."""
    value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
    return default if value is None else value


def architecture(config: Any) -> Architecture | None:
    """The registry entry of a config's ``model_type``; None when the engine does not run that type."""
    return ARCHITECTURES.get(str(_get(config, "model_type", "")))


def attention_shape(config: Any) -> tuple[int, int, int]:
    """``(num_heads, num_kv_heads, head_dim)`` of a config: KV heads default to the heads (no GQA), the head size
    to the config's ``head_dim``, else the registry's (gemma), else hidden size / heads."""
    num_heads = int(_get(config, "num_attention_heads"))
    num_kv_heads = int(_get(config, "num_key_value_heads", num_heads))
    arch = architecture(config)
    head_dim = _get(config, "head_dim") or (arch and arch.head_dim) or int(_get(config, "hidden_size")) // num_heads
    return num_heads, num_kv_heads, int(head_dim)


def kv_bytes_per_token(config: Any, dtype_bytes: int = 2) -> int:
    """KV bytes one token costs: 2 (K and V) x layers x KV heads x head dim x element size; 0 without layers."""
    num_layers = _get(config, "num_hidden_layers")
    if num_layers is None:
        return 0
    _, num_kv_heads, head_dim = attention_shape(config)
    return 2 * int(num_layers) * num_kv_heads * head_dim * dtype_bytes


def ties_embeddings(config: Any) -> bool:
    """Whether the LM head shares the embedding matrix (the registry's default when the config is silent)."""
    arch = architecture(config)
    return bool(_get(config, "tie_word_embeddings", arch is not None and arch.tie_word_embeddings))


def _attention_bias(arch: Architecture, config: Any) -> bool:
    """Whether the attention projections have biases (Q/K/V for "qkv" types, Q/K/V/O for "config" ones)."""
    if arch.attention_bias == "config":
        return bool(_get(config, "attention_bias", False))
    return arch.attention_bias == "qkv"


def _mlp_bias(arch: Architecture, config: Any) -> bool:
    return arch.mlp_bias and bool(_get(config, "mlp_bias", False))


def count_parameters(config: Any) -> int:
    """Parameters of a registered decoder-only transformer, from its config (``num_parameters`` when given).

    Per layer: Q/K/V/O projections (with biases where the type or config has them), optional Q/K norms, a
    gated MLP of three matrices (with ``mlp_bias``) and two norms; then the embedding, an untied LM head and
    the final norm.
    """
    if _get(config, "num_parameters"):
        return int(_get(config, "num_parameters"))
    arch = architecture(config) or Architecture("hf")
    hidden = int(_get(config, "hidden_size"))
    num_heads, num_kv_heads, head_dim = attention_shape(config)
    q_dim, kv_dim = num_heads * head_dim, num_kv_heads * head_dim
    inter = int(_get(config, "intermediate_size", 4 * hidden))
    attn = 2 * hidden * q_dim + 2 * hidden * kv_dim
    if _attention_bias(arch, config):
        attn += q_dim + 2 * kv_dim + (hidden if arch.attention_bias == "config" else 0)
    if arch.qk_norm == "head":
        attn += 2 * head_dim
    elif arch.qk_norm == "full":
        attn += q_dim + kv_dim
    mlp = 3 * hidden * inter + (2 * inter + hidden if _mlp_bias(arch, config) else 0)
    layers = int(_get(config, "num_hidden_layers")) * (attn + mlp + 2 * hidden)
    embed = int(_get(config, "vocab_size")) * hidden * (1 if ties_embeddings(config) else 2)
    return layers + embed + hidden


def execution_path(config: Any) -> ExecutionPath:
    """The path a config runs on: its type's, except that the fused decoder takes only full attention, SiLU,
    a bias-free MLP and no output-projection bias; anything else falls back to the HF modules."""
    arch = architecture(config)
    if arch is None or arch.path != "fused":
        return "hf"
    if any(t != "full_attention" for t in _get(config, "layer_types", [])):
        return "hf"
    if _get(config, "hidden_act", "silu") != "silu" or _mlp_bias(arch, config):
        return "hf"
    if arch.attention_bias == "config" and _attention_bias(arch, config):
        return "hf"  # the fused decoder has no bias on the output projection
    return "fused"


# --- embedding models ------------------------------------------------------------------------------------------
EmbeddingPath = Literal["encoder", "fused"]
Pooling = Literal["cls", "mean", "last"]


@dataclass(frozen=True, slots=True)
class EmbeddingArchitecture:
    """One type of embedding model: text in, one vector out (the document index's embedders, ``engine/docs``).

    Attributes:
        path: "encoder": a BERT-family encoder run by ``engine/model/encoder.py`` (bidirectional attention,
            post-norm layers); "fused": the fused Llama-family decoder (``engine/model/llama.py``) over the same
            weights as the chat models of that type, causal.
        rotary: the encoder's positions are rotary (nomic-bert: no position table, no biases, a SwiGLU MLP);
            False: a learned position table, biases everywhere and a GELU MLP (BERT).
        pooling: how token states become one vector when the folder does not say (sentence-transformers'
            ``1_Pooling/config.json`` does): "cls" (the first token), "mean" (over the real tokens), "last"
            (the last real token: decoder embedders).
        position_offset: the first position id of a sequence is the padding id + 1 (RoBERTa's learned
            positions start there); False: positions count from 0 (BERT).
        weight_prefixes: prefixes a checkpoint may put before the base model's parameter names (a BERT saved
            from ``BertForMaskedLM`` has ``bert.``, a Qwen3 saved from ``Qwen3ForCausalLM`` has ``model.`` where
            Qwen3-Embedding's own folders have none), stripped when loading.
        gguf_architecture: llama.cpp's ``general.architecture`` for this type ("" when Hearth reads no GGUF of
            it): a GGUF encoder is run by the same code, its tensors renamed.
        query_prompt, document_prompt: the task prefixes the model was trained with, used when the folder names
            none (nomic-embed-text's ``search_query: `` and ``search_document: ``; a GGUF file names none).
        tiny: the config fields of a tiny random model of this type, compared with transformers' own in
            ``tests/engine/model/test_embedding.py``.
    """

    path: EmbeddingPath
    pooling: Pooling
    position_offset: bool = False
    weight_prefixes: tuple[str, ...] = ()
    rotary: bool = False
    gguf_architecture: str = ""
    query_prompt: str = ""
    document_prompt: str = ""
    tiny: Mapping[str, Any] = field(default_factory=dict, hash=False)


_TINY_ENCODER: Mapping[str, Any] = {
    "vocab_size": 120, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "max_position_embeddings": 64, "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}  # fmt: skip

#: Every embedding model type the engine runs, from a Hugging Face folder or (where ``gguf_architecture`` is set)
#: a llama.cpp GGUF file.
EMBEDDING_ARCHITECTURES: dict[str, EmbeddingArchitecture] = {
    # bge, e5 (English), gte-base/small/large and all-MiniLM are BertModel checkpoints
    "bert": EmbeddingArchitecture(
        "encoder", "mean", weight_prefixes=("bert.",), gguf_architecture="bert", tiny=_TINY_ENCODER
    ),
    # nomic-embed-text v1/v1.5: rotary positions (base 1000), SwiGLU, no biases; the hub's folders keep the
    # original remote-code config keys (n_embd, n_layer...) and weight names (attn.Wqkv, mlp.fc11...)
    "nomic_bert": EmbeddingArchitecture(
        "encoder", "mean", weight_prefixes=("bert.", "nomic_bert."), rotary=True, gguf_architecture="nomic-bert",
        query_prompt="search_query: ", document_prompt="search_document: ",
        tiny={"vocab_size": 120, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
              "num_attention_heads": 4, "max_position_embeddings": 64},
    ),
    # multilingual-e5 and bge-m3 are XLM-RoBERTa encoders
    "xlm-roberta": EmbeddingArchitecture(
        "encoder", "mean", position_offset=True, weight_prefixes=("roberta.",),
        tiny={**_TINY_ENCODER, "type_vocab_size": 1, "pad_token_id": 1},
    ),
    "roberta": EmbeddingArchitecture(
        "encoder", "mean", position_offset=True, weight_prefixes=("roberta.",),
        tiny={**_TINY_ENCODER, "type_vocab_size": 1, "pad_token_id": 1},
    ),
    # Qwen3-Embedding: a qwen3 decoder whose last token's state is the text's vector
    "qwen3": EmbeddingArchitecture(
        "fused", "last", weight_prefixes=("model.",),
        tiny={"vocab_size": 120, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8},
    ),
}  # fmt: skip


#: llama.cpp's GGUF architecture name -> the embedding registry's type that runs it.
EMBEDDING_GGUF_TYPES: dict[str, str] = {
    a.gguf_architecture: t for t, a in EMBEDDING_ARCHITECTURES.items() if a.gguf_architecture
}


def embedding_architecture(config: Any) -> EmbeddingArchitecture | None:
    """The embedding registry's entry of a config's ``model_type``; None when no embedding model of it runs."""
    return EMBEDDING_ARCHITECTURES.get(str(_get(config, "model_type", "")))


def count_encoder_parameters(config: Any) -> int:
    """Parameters of a BERT-family encoder (without the pooler head): word, position and token-type embeddings
    and their LayerNorm; per layer Q/K/V/O with biases, the attention LayerNorm, the two MLP matrices with biases
    and the output LayerNorm."""
    hidden = int(_get(config, "hidden_size"))
    inter = int(_get(config, "intermediate_size", 4 * hidden))
    embed = (
        int(_get(config, "vocab_size")) + int(_get(config, "max_position_embeddings", 512))
        + int(_get(config, "type_vocab_size", 2))
    ) * hidden + 2 * hidden  # fmt: skip
    attention = 4 * (hidden * hidden + hidden) + 2 * hidden
    layer = attention + (hidden * inter + inter) + (inter * hidden + hidden) + 2 * hidden
    return embed + int(_get(config, "num_hidden_layers")) * layer
