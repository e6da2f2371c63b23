import math

import anyio
import anyio.lowlevel
import pytest

import orchestrator.testing as testing
from orchestrator._core.errors import ModelError, TransientModelError
from orchestrator._core.model import Model, ModelRequest, ModelResponse
from orchestrator.testing import Delay, FakeClock, FunctionModel, Hang, ScriptedModel

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def ask(text: str = "p") -> ModelRequest:
    return ModelRequest(
        purpose="short", system="s", messages=({"role": "user", "content": text},), max_tokens=8
    )


def test_public_names() -> None:
    assert testing.__all__ == tuple(sorted(testing.__all__))
    for name in testing.__all__:
        assert hasattr(testing, name)


async def test_fake_clock() -> None:
    clock = FakeClock(start=10.0)
    assert clock() == clock.now == 10.0
    clock.advance(2.5)
    assert clock() == 12.5
    with pytest.raises(ValueError, match="back in time"):
        clock.advance(-1)
    await clock.sleep(3)
    await clock.sleep(-4)  # a negative sleep is recorded but does not move time back
    assert clock.sleeps == [3, -4]
    assert clock.now == 15.5


async def test_fake_clock_sleep_is_a_cancellation_point() -> None:
    clock = FakeClock()
    with anyio.CancelScope() as scope:
        scope.deadline = -math.inf  # already cancelled
        await clock.sleep(5)
    assert scope.cancelled_caught
    assert clock.sleeps == []
    assert clock.now == 0.0


async def test_scripted_model_plays_its_script_in_order() -> None:
    clock = FakeClock()
    reply = ModelResponse(text="exact", stop_reason="length")
    error = TransientModelError("boom")
    model = ScriptedModel(
        ["plain", reply, error, Delay(seconds=7, then="late")],
        name="s/one",
        context_window=1000,
        clock=clock,
    )
    assert isinstance(model, Model)
    assert (model.name, model.context_window, model.remaining) == ("s/one", 1000, 4)
    first = await model.complete(ask("a"))
    assert (first.text, first.stop_reason, first.model, first.provider) == (
        "plain",
        "stop",
        "s/one",
        "scripted",
    )
    assert await model.complete(ask("b")) is reply
    with pytest.raises(ModelError) as caught:
        await model.complete(ask("c"))
    assert caught.value is error
    assert (await model.complete(ask("d"))).text == "late"
    assert clock.sleeps == [7]
    assert [r.prompt for r in model.requests] == ["a", "b", "c", "d"]
    assert model.remaining == 0


async def test_scripted_model_runs_out_loudly() -> None:
    model = ScriptedModel()
    model.push("only")
    assert (await model.complete(ask())).text == "only"
    with pytest.raises(RuntimeError, match="no scripted answer for call 2"):
        await model.complete(ask())


async def test_scripted_model_defaults_to_its_own_fake_clock() -> None:
    model = ScriptedModel([Delay(seconds=3, then=Delay(seconds=4, then="x"))])
    assert (await model.complete(ask())).text == "x"
    assert model.clock.now == 7


async def test_hang_ends_only_by_cancellation() -> None:
    model = ScriptedModel([Hang(), "after"])
    finished = False
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                nonlocal finished
                await model.complete(ask())
                finished = True

            tg.start_soon(call)
            await anyio.wait_all_tasks_blocked()
            assert len(model.requests) == 1
            scope.deadline = -math.inf
    assert scope.cancelled_caught
    assert not finished
    assert (await model.complete(ask())).text == "after"


async def test_function_model() -> None:
    async def answer(request: ModelRequest) -> ModelResponse | str:
        if request.prompt == "fail":
            raise ModelError("nope")
        if request.prompt == "full":
            return ModelResponse(text="full reply", stop_reason="toolUse")
        return request.prompt.upper()

    model = FunctionModel(answer, name="f/one", context_window=50)
    assert isinstance(model, Model)
    assert (model.name, model.context_window) == ("f/one", 50)
    short = await model.complete(ask("hi"))
    assert (short.text, short.model, short.provider) == ("HI", "f/one", "function")
    assert (await model.complete(ask("full"))).stop_reason == "toolUse"
    with pytest.raises(ModelError, match="nope"):
        await model.complete(ask("fail"))
    assert [r.prompt for r in model.requests] == ["hi", "full", "fail"]
