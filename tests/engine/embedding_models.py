"""Tiny random embedding models saved as real folders: transformers' model, a WordPiece tokenizer built with the
``tokenizers`` library, and sentence-transformers' pooling files, as a downloaded bge/e5/Qwen3-Embedding has."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from engine.architectures import EMBEDDING_ARCHITECTURES

_WORD_TEXT = (
    "the a of and to in is was for on lighthouse keeper lamp lens harbour boat ship sea storm night light tower "
    "paint money spent pounds museum foghorn clock motor oil rope door key shed report year members hall"
)
WORDS = _WORD_TEXT.split(" ")
#: Special tokens of each kind of vocabulary: BERT's, RoBERTa's, and a decoder's end-of-text.
SPECIALS = {
    "bert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    "roberta": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
    "decoder": ["<|pad|>", "<|unk|>", "<|endoftext|>"],
}


def build_tokenizer(kind: str, size: int) -> Tokenizer:
    """A lower-casing WordPiece tokenizer of ``size`` tokens: the kind's special tokens, the words above, letters and
    their ``##`` continuations; BERT-style ``[CLS] text [SEP]``, RoBERTa-style ``<s> text </s>``, or a decoder's
    ``text <|endoftext|>`` (as Qwen3-Embedding's tokenizer appends)."""
    specials = SPECIALS[kind]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab_list = [*specials, *WORDS, *letters, *(f"##{c}" for c in letters), ".", ",", "?"]
    vocab_list = list(dict.fromkeys(vocab_list))
    vocab_list += [f"[unused{i}]" for i in range(size - len(vocab_list))]  # as BERT's own vocabulary pads
    vocab = {tok: i for i, tok in enumerate(vocab_list[:size])}
    unk = specials[1] if kind == "decoder" else specials[1 if kind == "bert" else 3]
    tok = Tokenizer(models.WordPiece(vocab, unk_token=unk))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    if kind == "decoder":
        eos = specials[2]
        tok.post_processor = processors.TemplateProcessing(
            single=f"$A {eos}", special_tokens=[(eos, vocab[eos])]
        )
    else:
        first, last = (specials[2], specials[3]) if kind == "bert" else (specials[0], specials[2])
        tok.post_processor = processors.TemplateProcessing(
            single=f"{first} $A {last}", special_tokens=[(first, vocab[first]), (last, vocab[last])]
        )
    tok.add_special_tokens(specials)
    return tok


def write_pooling(folder: Path, pooling: str, prompts: dict[str, str] | None = None) -> None:
    """sentence-transformers' files: modules.json (Transformer, Pooling, Normalize) and 1_Pooling/config.json."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    modes = {
        "cls": "pooling_mode_cls_token",
        "mean": "pooling_mode_mean_tokens",
        "last": "pooling_mode_lasttoken",
    }
    config: dict[str, Any] = {"word_embedding_dimension": 32} | {mode: False for mode in modes.values()}
    config[modes[pooling]] = True
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    if prompts is not None:
        (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts}))


def build_tiny_embedder(
    model_type: str, folder: Path, pooling: str | None = None, causal_lm: bool = False, seed: int = 0
) -> tuple[Path, Any]:
    """A random tiny model of ``model_type`` (its registry ``tiny`` config) saved with its tokenizer; with
    ``pooling``, sentence-transformers' files too. Returns the folder and transformers' model (fp32, eval).

    A decoder is saved as transformers' base model (Qwen3-Embedding's layout), or with ``causal_lm`` as the causal
    LM (weights under ``model.``)."""
    import transformers

    arch = EMBEDDING_ARCHITECTURES[model_type]
    config = transformers.AutoConfig.for_model(model_type, **arch.tiny, initializer_range=0.2)
    torch.manual_seed(seed)
    if arch.path == "encoder":
        model = transformers.AutoModel.from_config(config, dtype=torch.float32, attn_implementation="eager")
        kind = "bert" if model_type in ("bert", "nomic_bert") else "roberta"
    else:
        cls = transformers.AutoModelForCausalLM if causal_lm else transformers.AutoModel
        model = cls.from_config(config, dtype=torch.float32, attn_implementation="eager")
        kind = "decoder"
    model.eval()
    model.save_pretrained(folder)
    build_tokenizer(kind, int(config.vocab_size)).save(str(folder / "tokenizer.json"))
    if pooling is not None:
        prompts = (
            {"query": "Instruct: find the passage\nQuery:", "document": ""} if kind == "decoder" else None
        )
        write_pooling(folder, pooling, prompts)
    return folder, model


#: nomic's original remote-code config of a transformers ``NomicBertConfig`` (what the hub's folders hold).
def nomic_original_config(config: Any) -> dict[str, Any]:
    return {
        "architectures": ["NomicBertModel"], "model_type": "nomic_bert", "activation_function": "swiglu",
        "n_embd": config.hidden_size, "n_layer": config.num_hidden_layers, "n_head": config.num_attention_heads,
        "n_inner": config.intermediate_size, "n_positions": 8 * config.max_position_embeddings,
        "max_trained_positions": config.max_position_embeddings, "vocab_size": config.vocab_size,
        "type_vocab_size": config.type_vocab_size, "layer_norm_epsilon": config.layer_norm_eps,
        "rotary_emb_base": config.rope_parameters["rope_theta"], "rotary_emb_fraction": 1.0,
        "rotary_emb_interleaved": False, "rotary_emb_scale_base": None, "rotary_scaling_factor": None,
        "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False, "prenorm": False, "causal": False,
        "parallel_block": False, "use_rms_norm": False, "pad_token_id": 0,
    }  # fmt: skip


def write_gguf(folder: Path, model: Any, path: Path, quantized: bool, pooling: int = 1) -> Path:
    """The tiny model saved in ``folder`` written as llama.cpp's converter writes it: tensors renamed by the ``gguf``
    package's own name map, 2-D weights as Q8_0 where ``quantized`` (rows of 32), the WordPiece vocabulary in
    llama.cpp's spelling (U+2581 before a word start, no ``##``), the bert/nomic-bert metadata. Returns the path."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    config = model.config
    nomic = config.model_type == "nomic_bert"
    arch = gguf.MODEL_ARCH.NOMIC_BERT if nomic else gguf.MODEL_ARCH.BERT
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(config.num_attention_heads)
    writer.add_layer_norm_eps(config.layer_norm_eps)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(pooling))
    if nomic:
        writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    vocab = sorted(tokenizer["model"]["vocab"].items(), key=lambda kv: kv[1])
    control = set(SPECIALS["bert"])
    tokens = [t if t in control else t[2:] if t.startswith("##") else "\u2581" + t for t, _ in vocab]
    writer.add_tokenizer_model("bert")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in control else 1 for t, _ in vocab])
    writer.add_token_type_count(config.type_vocab_size)
    writer.add_bos_token_id(tokens.index("[CLS]"))
    writer.add_sep_token_id(tokens.index("[SEP]"))
    writer.add_unk_token_id(tokens.index("[UNK]"))
    writer.add_pad_token_id(tokens.index("[PAD]"))
    for name, array in load_file(str(folder / "model.safetensors")).items():
        stem, _, suffix = name.rpartition(".")
        target = names.get_name(stem)
        if target is None or "pooler" in name:
            continue
        array = np.ascontiguousarray(array, dtype=np.float32)
        if quantized and array.ndim == 2 and array.shape[1] % 32 == 0:
            q = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(f"{target}.{suffix}", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(f"{target}.{suffix}", array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def gguf_reference(folder: Path, path: Path, out: Path) -> Any:
    """transformers' model over the GGUF's own (dequantized) weights: ``folder``'s files with each tensor the GGUF
    stores quantized replaced by its dequantized values, loaded by ``from_pretrained``."""
    import shutil

    import gguf
    import numpy as np
    import transformers
    from safetensors.numpy import load_file, save_file

    shutil.copytree(folder, out)
    reader = gguf.GGUFReader(str(path))
    quantized = {t.name: t for t in reader.tensors if t.tensor_type != gguf.GGMLQuantizationType.F32}
    config = transformers.AutoConfig.from_pretrained(folder)
    arch = gguf.MODEL_ARCH.NOMIC_BERT if config.model_type == "nomic_bert" else gguf.MODEL_ARCH.BERT
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    state = load_file(str(folder / "model.safetensors"))
    for name in list(state):
        stem, _, suffix = name.rpartition(".")
        target = f"{names.get_name(stem)}.{suffix}"
        if target in quantized:
            t = quantized[target]
            values = gguf.quants.dequantize(t.data, t.tensor_type)
            state[name] = np.ascontiguousarray(values.reshape(state[name].shape), dtype=np.float32)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return transformers.AutoModel.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager"
    ).eval()
