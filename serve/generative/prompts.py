"""Prompts as token ids: a completion's prompt, a chat's messages through the tokenizer's chat
template, or the plain template where the tokenizer has none.

The plain template, for a tokenizer without one: each message on its own line as
`<role>: <content>`, then `assistant:` for the answer to follow, e.g.

    system: You are terse.
    user: Who won the cup?
    assistant:
"""

from __future__ import annotations

ROLES = ("system", "user", "assistant", "developer", "tool")


class BadPrompt(ValueError):
    """A prompt or messages that cannot be turned into tokens: the 400's message."""


def completion_ids(tokenizer, prompt: str | list[int]) -> list[int]:
    """A completion's prompt: text (the tokenizer adds what it adds, e.g. BOS), or token ids
    as given, each checked against the vocabulary."""
    if isinstance(prompt, str):
        if not prompt:
            raise BadPrompt("prompt is empty")
        return tokenizer(prompt)["input_ids"]
    size = len(tokenizer)
    bad = [token for token in prompt if not 0 <= token < size]
    if not prompt or bad:
        raise BadPrompt("prompt is an empty list of token ids" if not prompt else
                        f"prompt holds token ids outside the vocabulary (0-{size - 1}): "
                        f"{bad[:5]}")
    return list(prompt)


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The messages as the model expects them, with the assistant's turn opened."""
    if not messages:
        raise BadPrompt("messages is empty")
    messages = [{"role": _role(i, m), "content": _content(i, m)} for i, m in enumerate(messages)]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return tokenizer(plain_chat(messages))["input_ids"]


def plain_chat(messages: list[dict]) -> str:
    """The plain template (see the module's docstring)."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def _role(i: int, message: dict) -> str:
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise BadPrompt(f"messages[{i}].role must be one of {', '.join(ROLES)}")
    return message["role"]


def _content(i: int, message: dict) -> str:
    """Text, or OpenAI's content parts of type `text`, joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
            isinstance(part, dict) and part.get("type") == "text"
            and isinstance(part.get("text"), str) for part in content):
        return "".join(part["text"] for part in content)
    raise BadPrompt(f"messages[{i}].content must be text or a list of text parts")
