"""Where migrated rows go (`rlhfless.runtime.stages.destination`): the planner's choice while it decodes, else a
running actor, else a warm finished one (re-invoked), else a fresh function."""

from types import SimpleNamespace

from rlhfless.runtime.stages import _Actor, destination


def actor(i: int, *, done=False, cut=False) -> _Actor:
    return _Actor(i, SimpleNamespace(worker=f"decode-{i}"), set(), 0.0, cold=False, done=done, cut=cut)


def test_the_planners_choice_wins_while_it_still_decodes():
    a, b = actor(0), actor(1)
    assert destination(b, [a, b], {"decode-0", "decode-1"}) is b


def test_a_finished_or_gone_choice_falls_back_to_a_running_actor_that_was_not_cut():
    src, done, other = actor(0, cut=True), actor(1, done=True), actor(2)
    assert destination(done, [src, done, other], {"decode-0", "decode-1", "decode-2"}) is other
    gone = actor(3)
    assert destination(gone, [src, gone, other], {"decode-0", "decode-2"}) is other


def test_when_nothing_runs_a_warm_finished_actor_is_reused_before_a_cold_start():
    # the CI failure this fixes: the destination finished before the cut rows arrived; a fresh Ray actor then
    # queued forever behind the warm (kept-alive) workers holding every logical CPU
    src, done = actor(0, cut=True), actor(1, done=True)
    assert destination(done, [src, done], {"decode-0", "decode-1"}) is done
    assert destination(None, [src, done], {"decode-0", "decode-1"}) is done


def test_a_fresh_function_only_when_no_worker_of_the_step_is_left():
    src, released = actor(0, cut=True), actor(1, done=True)  # keep-alive 0: released on finishing
    assert destination(released, [src, released], {"decode-0"}) is None
