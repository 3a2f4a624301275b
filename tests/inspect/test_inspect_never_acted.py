"""Whether an Inspect sample's model answered, read from Inspect's own transcript objects (the
end-to-end path, a provider refusing the first call, is
tests/e2e/test_inspect_eval.py::test_a_sample_whose_provider_refused_its_first_call_is_run_again_at_no_cost)."""

from __future__ import annotations

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai.event import Event, ModelEvent, ToolEvent
from inspect_ai.log._transcript import Transcript, init_transcript
from inspect_ai.model import GenerateConfig, ModelOutput

from apg_farm.inspect.sandbox import model_answered

MODEL = "mockllm/model"


def _call(error: str | None = None) -> ModelEvent:
    output = ModelOutput(model=MODEL) if error else ModelOutput.from_content(MODEL, "done")
    return ModelEvent(
        model=MODEL,
        input=[],
        tools=[],
        tool_choice="none",
        config=GenerateConfig(),
        output=output,
        error=error,
    )


@pytest.mark.parametrize(
    ("events", "answered"),
    [
        pytest.param([], None, id="no-call-seen"),
        pytest.param([_call("429 Too Many Requests")], False, id="refused"),
        pytest.param([_call("429"), _call()], True, id="refused-then-answered"),
        pytest.param(
            [_call("429"), ToolEvent(id="1", function="bash", arguments={})], True, id="tool"
        ),
    ],
)
def test_a_model_answered_only_when_the_transcript_shows_an_answer(
    events: list[Event], answered: bool | None
) -> None:
    init_transcript(Transcript(events))
    assert model_answered() is answered


def test_a_cut_transcript_cannot_tell() -> None:
    """A bounded transcript keeps its tail only: an answer may have been cut, so it is unknown
    (and an unknown never makes a sample one whose model never acted)."""
    cut = Transcript([_call("429")])
    cut._events_truncated = True
    init_transcript(cut)
    assert model_answered() is None
