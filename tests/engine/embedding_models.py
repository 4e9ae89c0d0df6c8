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
        kind = "bert" if model_type == "bert" else "roberta"
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
