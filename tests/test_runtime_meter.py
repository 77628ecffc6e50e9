"""The billing meter on hand-made timelines: cold start, warm reuse, keep-alive, scale to zero, a serverful pool."""

import pytest

from rlhfless.plan.cost import CATALOG
from rlhfless.runtime.meter import bill_run, bill_window, rounded
from rlhfless.runtime.records import KINDS_ALL, InvocationRecord, WorkerRecord

CPU = CATALOG["cpu-core"]
H100 = CATALOG["H100"]


def inv(worker, kind, t0, t1, step=1, cold=False, units=1.0):
    return InvocationRecord(step, kind, worker, units, t0, t0, t1, cold)


def test_rounding_keeps_exact_multiples_and_rounds_up_the_rest():
    assert rounded(3.0000000001, 1.0) == 3.0
    assert rounded(3.2, 1.0) == 4.0
    assert rounded(0.0123, 0.001) == pytest.approx(0.013)
    assert rounded(0.0, 1.0) == 0.0


def test_cold_start_then_work_then_release_is_billed_start_to_stop():
    # requested at 1.0, ready at 1.5 (cold start 0.5 s), busy 1.5-3.0, released at 3.0: 2 s billed
    w = WorkerRecord("decode-0", ("decode",), 1.0, (0,), spawned_s=1.0, ready_s=1.5, released_s=3.0)
    b = bill_run([w], [inv("decode-0", "decode", 1.5, 3.0, cold=True)], now=10.0, price=CPU, serverful=False,
                 granularity_s=1.0)
    assert b.device_s == 2.0
    assert b.by_kind == {"decode": 2.0}
    assert b.cold_starts == 1 and b.cold_start_s == pytest.approx(0.5)
    assert b.idle_fraction == pytest.approx(0.25)  # the cold start is held but not busy
    assert b.usd == pytest.approx(2.0 * CPU.serverless_usd_per_s)


def test_warm_reuse_within_keep_alive_bills_the_idle_gap_and_only_one_cold_start():
    # one worker, two invocations 1 s apart (kept warm), released 0.5 s after the second one ends
    w = WorkerRecord("learner-0", ("learner",), 1.0, (0,), 0.0, 0.2, 4.5)
    invs = [inv("learner-0", "learner", 0.2, 2.0, step=1, cold=True), inv("learner-0", "learner", 3.0, 4.0, step=2)]
    b = bill_run([w], invs, 10.0, CPU, False, 0.001)
    assert b.device_s == pytest.approx(4.5)
    assert b.busy_s == pytest.approx(2.8)
    assert b.cold_starts == 1


def test_scale_to_zero_bills_nothing_between_lifetimes():
    # released after each invocation, started again cold: the 2 s gap between them is not billed
    ws = [WorkerRecord("d-0", ("decode",), 1.0, (0,), 0.0, 0.1, 1.0),
          WorkerRecord("d-1", ("decode",), 1.0, (0,), 3.0, 3.1, 4.0)]
    b = bill_run(ws, [], 10.0, CPU, False, 0.001)
    assert b.device_s == pytest.approx(2.0)
    assert b.cold_starts == 2 and b.cold_start_s == pytest.approx(0.2)


def test_step_windows_slice_lifetimes_and_add_up_to_the_run():
    ws = [WorkerRecord("pool-0", KINDS_ALL, 1.0, (0,), 0.0, 0.5, 6.0),
          WorkerRecord("pool-1", KINDS_ALL, 1.0, (1,), 0.0, 0.5, 6.0)]
    step1 = bill_window(ws, [], 0.0, 2.0, 6.0, CPU, True)
    step2 = bill_window(ws, [], 2.0, 6.0, 6.0, CPU, True)
    assert step1.device_s == pytest.approx(4.0) and step2.device_s == pytest.approx(8.0)
    assert step1.by_kind == {"pool": pytest.approx(4.0)}
    assert step1.cold_starts == 2 and step2.cold_starts == 0
    total = bill_run(ws, [], 6.0, CPU, True, 0.001)
    assert total.device_s == pytest.approx(step1.device_s + step2.device_s)


def test_serverful_uses_the_on_demand_price_and_serverless_the_per_second_price():
    w = [WorkerRecord("pool-0", KINDS_ALL, 1.0, (0,), 0.0, 0.0, 3600.0)]
    assert bill_run(w, [], 3600.0, H100, True, 1.0).usd == pytest.approx(H100.ondemand_usd_per_h)
    assert bill_run(w, [], 3600.0, H100, False, 1.0).usd == pytest.approx(3600 * H100.serverless_usd_per_s)


def test_an_alive_worker_is_billed_until_now_and_a_killed_one_until_it_died():
    alive = WorkerRecord("d-0", ("decode",), 2.0, (0, 1), 1.0, 1.2, None)
    killed = WorkerRecord("d-1", ("decode",), 1.0, (0,), 0.0, 0.1, 0.7, killed=True)
    b = bill_window([alive, killed], [], 0.0, 10.0, 4.0, CPU, False)
    assert b.device_s == pytest.approx(2.0 * 3.0 + 0.7)


def test_busy_time_is_the_sum_of_invocations_and_idle_the_rest_of_the_held_time():
    w = WorkerRecord("d-0", ("decode",), 1.0, (0,), 0.0, 0.0, 2.0)
    invs = [inv("d-0", "decode", 0.0, 1.8), inv("d-0", "reward", 1.8, 1.9)]  # reward follows its decode
    b = bill_run([w], invs, 2.0, CPU, False, 0.001)
    assert b.busy_s == pytest.approx(1.9) and b.idle_fraction == pytest.approx(0.05)


@pytest.mark.parametrize("granularity, keep_alive", [(0.001, 0.0), (1.0, 0.0), (1.0, 2.0), (0.25, 0.7)])
def test_planner_and_meter_bill_the_same_invocation_the_same(granularity, keep_alive):
    # one set of billing rules, built from the runtime's settings: the planner prices a cold invocation of
    # 1.5 s cold start + 2.3 s of work with keep_alive_s of idle after it; the meter sees the worker that ran it
    # (spawned, ready after the cold start, busy, idle keep_alive_s, released) and bills its lifetime
    from types import SimpleNamespace

    from rlhfless.plan.cost import Invocation, cost_step
    from rlhfless.runtime.meter import billing_rules

    rules = billing_rules(SimpleNamespace(billing_granularity_s=granularity, keep_alive_s=keep_alive))
    planned, _ = cost_step([Invocation("decode", 0, 10.0, 13.8, cold=True, gpus=8.0, cold_start_s=1.5)], H100, rules)
    w = WorkerRecord("decode-0", ("decode",), 8.0, (0,), spawned_s=10.0, ready_s=11.5, released_s=13.8 + keep_alive)
    billed = bill_run([w], [inv("decode-0", "decode", 11.5, 13.8, cold=True, units=8.0)], 99.0, H100, False, rules)
    assert billed.device_s == pytest.approx(planned.gpu_seconds)
    assert billed.usd == pytest.approx(planned.usd)


def test_meter_follows_the_rules_it_is_given_not_a_copy_of_them():
    # a rule only the shared BillingRules knows (cold start unbilled) changes the meter's bill too
    from rlhfless.plan.cost import BillingRules

    w = WorkerRecord("d-0", ("decode",), 1.0, (0,), spawned_s=0.0, ready_s=1.5, released_s=4.0)
    free_cold = BillingRules(granularity_s=1.0, keep_alive_s=0.0, bill_cold_start=False)
    assert bill_run([w], [], 9.0, CPU, False, free_cold).device_s == 3.0  # 2.5 s rounded up
    assert bill_run([w], [], 9.0, CPU, False, 1.0).device_s == 4.0


def test_time_off_the_clock_is_cut_out_of_every_lifetime_in_windows_and_runs():
    """A pool held 0-10 s with an evaluation off the clock at 4-6 s: 8 s each; a serverless function alive 3-5 s
    loses the 1 s it overlapped; one spawned during the pause (5-7 s) loses 1 s; windows add up to the run."""
    ws = [WorkerRecord("pool-0", KINDS_ALL, 1.0, (0,), 0.0, 0.5, 10.0),
          WorkerRecord("decode-1", ("decode",), 1.0, (1,), 3.0, 3.2, 5.0),
          WorkerRecord("decode-2", ("decode",), 2.0, (1,), 5.0, 5.5, 7.0)]
    paused = [(4.0, 6.0)]
    plain = [10.0 - 2.0, (5.0 - 3.0) - (5.0 - 4.0), 2.0 * ((7.0 - 5.0) - (6.0 - 5.0))]  # held - paused, x units
    run = bill_run(ws, [], 10.0, CPU, False, 0.001, paused)
    assert run.device_s == pytest.approx(sum(plain))
    assert run.by_kind == {"pool": pytest.approx(plain[0]), "decode": pytest.approx(plain[1] + plain[2])}
    windows = [bill_window(ws, [], a, b, 10.0, CPU, False, paused).device_s for a, b in [(0, 4.5), (4.5, 10.0)]]
    assert windows[0] == pytest.approx(4.5 - 0.5 + 1.0) and sum(windows) == pytest.approx(run.device_s)
    assert bill_window(ws, [], 4.0, 6.0, 10.0, CPU, True, paused).device_s == 0.0
    assert bill_run(ws, [], 10.0, CPU, False, 0.001).device_s == pytest.approx(10.0 + 2.0 + 4.0)  # nothing paused


def _split_reference(w, invs, a, b, dt=1e-3):
    """role_split by brute force: label every dt-slice of [a, b) inside the lifetime."""
    out = {}
    mine = sorted((i for i in invs if i.worker == w.worker), key=lambda i: i.requested_s)
    t = a + dt / 2
    while t < b:
        if w.spawned_s <= t < w.released_s:
            before = [i for i in mine if i.requested_s <= t]
            k = (before[-1] if before else mine[0]).kind
            k = "decode" if k == "reward" else k
            out[k] = out.get(k, 0.0) + dt
        t += dt
    return out


def test_a_hybrid_function_is_billed_to_the_role_it_was_in():
    """A decode+learner function (runtime.hybrid): cold start and decode (and scoring) to decode, the learner
    rank and its idle after to learner, a decode of the next step to decode again; windows and runs agree with a
    brute-force labelling, and the parts add up to the bill."""
    from rlhfless.runtime.meter import role_split

    w = WorkerRecord("decode+learner-0", ("decode", "learner"), 1.0, (0,), 0.0, 0.3, 5.0)
    invs = [inv("decode+learner-0", "decode", 0.3, 1.2), inv("decode+learner-0", "reward", 1.2, 1.25),
            inv("decode+learner-0", "learner", 1.4, 2.6), inv("decode+learner-0", "decode", 3.1, 4.0, step=2),
            inv("other-1", "learner", 0.0, 5.0)]
    for a, b in [(0.0, 10.0), (1.0, 3.5), (2.0, 2.5), (3.2, 6.0)]:
        got, ref = role_split(w, invs, a, b), _split_reference(w, invs, a, b)
        assert got.keys() == ref.keys() and all(got[k] == pytest.approx(ref[k], abs=3e-3) for k in got)
    assert role_split(w, invs, 0.0, 10.0) == pytest.approx({"decode": 1.4 + 1.9, "learner": 1.7})
    run = bill_run([w], invs, 10.0, CPU, False, 1.0)
    assert run.device_s == 5.0 and sum(run.by_kind.values()) == pytest.approx(5.0)
    assert run.by_kind == pytest.approx({"decode": 3.3, "learner": 1.7})
    win = bill_window([w], invs, 1.0, 3.5, 10.0, CPU, False)
    assert win.by_kind == pytest.approx({"decode": 0.4 + 0.4, "learner": 1.7})
    single = WorkerRecord("decode-1", ("decode",), 1.0, (1,), 0.0, 0.1, 2.0)
    assert bill_run([single], [inv("decode-1", "decode", 0.1, 2.0)], 10.0, CPU, False, 1.0).by_kind == {"decode": 2.0}


def test_a_ppo_critic_function_is_billed_to_values_then_critic_and_to_values_before_any_invocation():
    """PPO's critic image (values+critic): the value forward and its cold start to values, the critic update and
    its keep-alive to critic; one pre-warmed and evicted before any invocation is a value function (not decode)."""
    from rlhfless.runtime.meter import role_split
    from rlhfless.runtime.records import CRITIC_IMAGE

    w = WorkerRecord("values+critic-0", CRITIC_IMAGE, 1.0, (0,), 0.0, 0.2, 3.0)
    invs = [inv("values+critic-0", "values", 0.5, 0.9), inv("values+critic-0", "critic", 1.0, 2.0)]
    assert role_split(w, invs, 0.0, 10.0) == pytest.approx({"values": 1.0, "critic": 2.0})
    idle = WorkerRecord("values+critic-1", CRITIC_IMAGE, 1.0, (1,), 0.0, 0.2, 0.7)
    assert role_split(idle, invs, 0.0, 10.0) == pytest.approx({"values": 0.7})
    hybrid = WorkerRecord("decode+learner-2", ("decode", "learner"), 1.0, (1,), 0.0, 0.2, 0.7)
    assert role_split(hybrid, [], 0.0, 10.0) == pytest.approx({"decode": 0.7})


def test_a_hybrid_decode_function_is_priced_as_its_decode_share_of_the_bill():
    """With the hybrid image the planner prices a decode function without the keep-alive after it (the worker
    goes on as a learner rank, billed to the learner): what it prices is the meter's decode share."""
    from types import SimpleNamespace

    from rlhfless.plan.cost import Invocation, cost_step
    from rlhfless.runtime.meter import billing_rules
    from rlhfless.runtime.records import HYBRID

    rt = SimpleNamespace(billing_granularity_s=0.001, keep_alive_s=2.0, hybrid=True, mode="serverless")
    planned, _ = cost_step([Invocation("decode", 0, 10.0, 13.8, cold=True, gpus=1.0, cold_start_s=1.5)], CPU,
                           billing_rules(rt, decode=True))
    w = WorkerRecord("decode+learner-0", HYBRID, 1.0, (0,), spawned_s=10.0, ready_s=11.5, released_s=20.0)
    invs = [inv(w.worker, "decode", 11.5, 13.8), inv(w.worker, "learner", 13.8, 18.0)]
    billed = bill_run([w], invs, 99.0, CPU, False, billing_rules(rt))
    assert billed.by_kind["decode"] == pytest.approx(planned.gpu_seconds) == pytest.approx(3.8)
    assert billed.by_kind["learner"] == pytest.approx(6.2)
    separate = SimpleNamespace(**{**vars(rt), "hybrid": False})
    assert billing_rules(separate, decode=True).keep_alive_s == 2.0 == billing_rules(rt).keep_alive_s


def test_a_step_window_bills_a_hybrid_function_by_its_earlier_work_and_never_to_a_mixed_kind():
    """A step's window sees a hybrid function (runtime.hybrid) idle after the previous step's learner rank, and one
    pre-warmed for the next step (not invoked yet). Given every invocation so far, the first is learner keep-alive
    (as the run's bill says) and the second decode; neither is billed to "decode+learner", which has no
    function/<kind>/billed_s meaning. Windows add up to the run's split."""
    kept = WorkerRecord("decode+learner-0", ("decode", "learner"), 1.0, (0,), 0.0, 0.3, 6.0)
    fresh = WorkerRecord("decode+learner-1", ("decode", "learner"), 1.0, (1,), 4.5, 4.8, 8.0)
    invs = [inv("decode+learner-0", "decode", 0.3, 1.2), inv("decode+learner-0", "learner", 1.4, 2.6),
            inv("decode+learner-0", "decode", 5.0, 5.5, step=2), inv("decode+learner-1", "decode", 5.1, 7.0, step=2)]
    step1 = bill_window([kept, fresh], invs[:2], 0.0, 5.0, 5.0, CPU, False)  # at step 1's end: step 2 not run yet
    assert step1.by_kind == pytest.approx({"decode": 1.4 + 0.5, "learner": 3.6})
    step2 = bill_window([kept, fresh], invs, 5.0, 10.0, 10.0, CPU, False)
    assert step2.by_kind == pytest.approx({"decode": 1.0 + 3.0})
    whole = bill_run([kept, fresh], invs, 10.0, CPU, False, 0.001)
    assert whole.by_kind == pytest.approx({k: step1.by_kind.get(k, 0) + step2.by_kind.get(k, 0)
                                           for k in ("decode", "learner")}, abs=2e-3)
