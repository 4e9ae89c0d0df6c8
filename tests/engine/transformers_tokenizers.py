"""Tiny tokenizer folders that load through transformers' AutoTokenizer, not the plain :class:`Tokenizer`.

``qwen2_folder``: the default model's byte-level BPE named ``Qwen2Tokenizer``, as Hearth writes the side folder
of a Qwen2/Qwen3 GGUF, with a Qwen-style template (tools, tool calls, tool results). ``llama_folder``: a
SentencePiece vocabulary written as a llama GGUF, converted by transformers and named ``LlamaTokenizer`` (an HF
Llama-2 folder), with the Llama-2 template (``bos_token``, ``eos_token``, ``raise_exception``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

QWEN_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}

# Tools

<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}{% continue %}{% endif %}
{%- if message.role == 'assistant' and message.tool_calls is defined %}<|im_start|>assistant
{% if message.content %}{{ message.content }}{% endif %}
{%- for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)

#: SentencePiece pieces (after the unknown, bos, eos and 256 byte tokens), most likely first.
_PIECES = ["▁", "e", "t", "a", "o", "i", "n", "s", "h", "r", "l", "d", "u", "c", "m", "w", "y", "f", "g", "p", "b", "v",
           "k", "?", ".", ",", "!", "2", "+", "[", "]", "/", "<", ">", "I", "N", "S", "T", "H", "W", "B", "Y", "▁t",
           "he", "▁the", "▁a", "in", "er", "▁w", "an", "▁s", "ou", "▁[", "IN", "ST", "▁I", "NST", "SY", "▁<"]  # fmt: skip


def _write_template(folder: Path, template: str) -> None:
    (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def _name_class(folder: Path, tokenizer_class: str) -> None:
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": tokenizer_class}))


def qwen2_folder(default_model_dir: Path, out: Path, template: str = QWEN_TEMPLATE) -> Path:
    """A ``Qwen2Tokenizer`` folder: the default model's tokenizer files, that class named, ``template``."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir / name, out / name)
    _name_class(out, "Qwen2Tokenizer")
    _write_template(out, template)
    return out


def llama_folder(out: Path, template: str = LLAMA2_TEMPLATE) -> Path:
    """A ``LlamaTokenizer`` folder: a tiny SentencePiece llama GGUF as transformers converts and saves it."""
    from gguf import GGUFWriter
    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *_PIECES]
    types = [2, 3, 3, *[6] * 256, *[1] * len(_PIECES)]  # unknown, control, byte, normal
    writer = GGUFWriter(str(out / "spm.gguf"), "llama")
    for add, value in ((writer.add_block_count, 1), (writer.add_context_length, 64), (writer.add_head_count, 1),
                       (writer.add_embedding_length, 8), (writer.add_feed_forward_length, 8)):  # fmt: skip
        add(value)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(_PIECES))])
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    folder = out / "tokenizer"
    AutoTokenizer.from_pretrained(str(out), gguf_file="spm.gguf", local_files_only=True).save_pretrained(folder)
    _name_class(folder, "LlamaTokenizer")
    _write_template(folder, template)
    return folder
