"""append_piece: the one rule by which the loop and a follower grow a partial reply."""

from __future__ import annotations

from core.messages import AssistantMessage, TextContent, ThinkingContent, ToolCall
from core.partial import append_piece


def test_pieces_grow_the_block_at_their_index_or_open_the_next_one() -> None:
    message = AssistantMessage(content=[])
    append_piece(message, 0, "thinking", "hm")
    append_piece(message, 0, "thinking", "m.")
    append_piece(message, 1, "text", "Hello")  # no block 1 yet: a new text block
    append_piece(message, 1, "text", ", world")
    message.content.append(ToolCall(id="c1", name="read"))
    append_piece(message, 2, "text", "after")  # block 2 is a tool call: a new block after it
    assert message.content == [
        ThinkingContent(thinking="hmm."),
        TextContent(text="Hello, world"),
        ToolCall(id="c1", name="read"),
        TextContent(text="after"),
    ]
    # As pydantic's setattr would: the grown fields count as set (a dump with exclude_unset keeps them).
    assert message.content[1].model_dump(exclude_unset=True)["text"] == "Hello, world"


def test_a_text_kept_by_a_reader_is_not_changed_by_later_pieces() -> None:
    message = AssistantMessage(content=[TextContent(text="a")])
    kept = message.content[0].text
    append_piece(message, 0, "text", "b")
    assert kept == "a" and message.content[0].text == "ab"
