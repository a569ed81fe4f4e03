"""The built-in ``ask_user`` tool: the model asks the person structured questions.

The same tool as cubeloop's ``ask_user_tool`` (cubeloop/hitl/ask_user.py:18-127): the same
name, parameters (``{"questions": [{key, prompt, options?, multi_select?, required?}]}``),
description, and result (``"User answers:\\n"`` and the answers as indented JSON,
``details={"hitl": {"kind": "ask", "answers": ...}}``, :func:`core.hitl_results.ask_answered_result`),
and the same question id for the same questions (:func:`core.hitl.question_id_for`), so a
thread paused by one program's ``ask_user`` is continued by the other's. The questions go
through ``ToolContext.human`` (:mod:`core.human_wait`): persisted, waited for, and applied
once answered, here or after a resume.
"""

from __future__ import annotations

from pydantic import BaseModel

from core.hitl import Option, Question
from core.hitl_results import ask_answered_result
from core.tools import AgentTool, AgentToolResult, ToolContext

ASK_USER = "ask_user"
"""The tool's name (cubeloop's)."""


class _OptionDef(BaseModel):
    label: str
    value: str
    description: str | None = None
    allow_input: bool = False


class _QuestionDef(BaseModel):
    key: str
    prompt: str
    options: list[_OptionDef] | None = None
    multi_select: bool = False
    required: bool = True


class AskUserParams(BaseModel):
    """The tool's arguments: the questions, each answered under its ``key``."""

    questions: list[_QuestionDef]


DESCRIPTION = (
    "Ask the user one or more structured questions and pause until they answer.\n"
    "\n"
    "PREFER this tool whenever you need:\n"
    "- A choice from a small fixed set (use `options`, single or multi-select).\n"
    "- A specific piece of structured info (name, date, file path, value).\n"
    "- Confirmation before taking an action.\n"
    "\n"
    "When the answer is naturally one of a few options, ALWAYS use `options`.\n"
    "If the user might want to pick something outside the list, add one option\n"
    'with `allow_input: true` (an "Other / specify" escape) rather than\n'
    "falling back to a free-text question.\n"
    "\n"
    "Skip this tool ONLY for genuinely open-ended input — paragraph-length\n"
    "explanations, creative writing, ambiguous multi-part requests. For those,\n"
    "end your turn with the question as text and the user's next message will\n"
    "be the answer."
)
"""cubeloop's description of the tool, word for word (cubeloop/hitl/ask_user.py:38-55)."""


class AskUserTool(AgentTool):
    """``ask_user``: asks its questions as one ``ask`` request and returns the answers
    (see the module docstring). Not idempotent: a resume re-runs it only to take the
    stored answer of the question it asked, never to ask again unasked."""

    name = ASK_USER
    description = DESCRIPTION
    parameters = AskUserParams

    async def invoke(self, ctx: ToolContext, params: BaseModel) -> AgentToolResult:
        """Ask ``params.questions`` through ``ctx.human`` and return the answers."""
        assert isinstance(params, AskUserParams)
        questions = [
            Question(
                key=q.key,
                prompt=q.prompt,
                options=[Option(**o.model_dump()) for o in q.options] if q.options else None,
                multi_select=q.multi_select,
                required=q.required,
            )
            for q in params.questions
        ]
        answers = await ctx.human.ask(questions)
        outcome = ask_answered_result(answers)
        return AgentToolResult(outcome.text or "", details={"hitl": outcome.hitl})


def ask_user_tool() -> AskUserTool:
    """A new ``ask_user`` tool to give an :class:`~core.agent.Agent` (``tools=[..., ask_user_tool()]``)."""
    return AskUserTool()
