"""How a prompt becomes token ids: raw text, or one user turn through the tokenizer's chat template.

A chat prompt is a `ChatPrompt`, a `str` that says it is a user turn, so every list of prompts stays a list
of strings (files, digests, JSON) while the flag travels with the text: a prompts file line
`{"prompt": "...", "chat": true}`, MT-bench's and ShareGPT's turns (`acchead.chat_sets`) are chat prompts;
HumanEval's and the stdlib function headers are raw completions.

    encode_prompt(tokenizer, ChatPrompt("Write a haiku."))   # <|im_start|>user ... <|im_start|>assistant
    encode_prompt(tokenizer, "def fib(n):")                  # the tokenizer's own special tokens (BOS)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from acchead.errors import AccheadError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class ChatPrompt(str):
    """A prompt that is one user turn: encoded through the chat template with the assistant's generation
    prompt appended."""

    __slots__ = ()


def is_chat(prompt: str) -> bool:
    return isinstance(prompt, ChatPrompt)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str, chat: bool = False) -> list[int]:
    """Token ids of `prompt`: through the chat template when it is a `ChatPrompt` or `chat` is set (the
    template supplies the special tokens, so none are added again), else with the tokenizer's own."""
    if not (chat or is_chat(prompt)):
        return tokenizer(str(prompt)).input_ids
    if not getattr(tokenizer, "chat_template", None):
        raise AccheadError("the target's tokenizer has no chat template, which a chat prompt needs")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": str(prompt)}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False).input_ids
