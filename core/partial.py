"""Growing a partial reply by one streamed piece: the one rule the loop and the live feed share.

The agent loop (:mod:`core.loop`) applies each provider delta to the reply it streams, and a
follower (:mod:`core.live`) applies each stored delta row to the reply it rebuilds; both must
put a piece in the same block and grow it the same way, so that a followed reply equals the
streamed one.
"""

from __future__ import annotations

from typing import Literal

from core.messages import AssistantMessage, TextContent, ThinkingContent

PieceKind = Literal["text", "thinking"]
"""Which string a piece extends: a text block's ``text`` or a thinking block's ``thinking``."""


def append_piece(message: AssistantMessage, index: int, kind: PieceKind, piece: str) -> None:
    """Append ``piece`` to block ``index`` of ``message`` (a :class:`TextContent` for
    ``"text"``, a :class:`ThinkingContent` for ``"thinking"``), in amortised O(len(piece)).

    The block at ``index`` is used when it has that kind; otherwise (no block there yet, or
    another kind) a new block is appended to the content, as the stream's next block.

    ``block.text += piece`` through pydantic's ``__setattr__`` builds a new string of the
    whole reply per token: quadratic in the reply's length (profiled in the app at 5,000
    tok/s: half the main thread 20 s into a one-paragraph reply, 8 s of CPU for 500 kB
    appended in 125,000 tokens). Taken out of the model's ``__dict__`` first, the string
    is referenced only by the local, so CPython's ``str +=`` grows it in place (realloc);
    when another reference holds it (a listener kept the text), it is copied, once, as
    before. Either way the field is a complete ``str`` at every moment a reader can see it.
    """
    block_type = TextContent if kind == "text" else ThinkingContent
    blocks = message.content
    block = blocks[index] if index < len(blocks) else None
    if not isinstance(block, block_type):
        block = block_type()
        blocks.append(block)
    fields = block.__dict__
    text = fields.pop(kind)
    try:
        text += piece
    finally:
        fields[kind] = text
    block.__pydantic_fields_set__.add(kind)  # as pydantic's __setattr__ records it
