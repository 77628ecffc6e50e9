"""Metric-name constants: `<component>/<quantity>[/<stat>]`.

Names users already know from verl/OpenRLHF where they exist (`timing_s/<stage>`, `perf/throughput`,
`response_length/*`), plus ours for cost, planning, prediction and prefill. Modules return plain dicts keyed by
these names; only `rlhfless.run.tracking` talks to W&B.
"""

# rollout and learning
REWARD_MEAN = "reward/mean"
REWARD_STD = "reward/std"
ACCURACY = "reward/accuracy"
FORMAT_OK = "reward/format_ok"
RESP_LEN_MEAN = "response_length/mean"
RESP_LEN_MAX = "response_length/max"
RESP_LEN_MIN = "response_length/min"
RESP_LEN_CLIP = "response_length/clip_ratio"
LOSS = "actor/loss"
KL = "actor/kl"
ENTROPY = "actor/entropy"
GRAD_NORM = "actor/grad_norm"
CLIP_FRAC = "actor/clip_frac"
CLIP_FRAC_LOWER = "actor/pg_clipfrac_lower"  # dual_clip: share of valid tokens whose negative-advantage loss is capped
LR = "actor/lr"
GROUPS_SKIPPED = "actor/groups_skipped_frac"
THROUGHPUT = "perf/throughput"
TOKENS = "perf/total_tokens"
EVAL_ACC = "eval/accuracy"
EVAL_ACC_GREEDY = "eval/accuracy_greedy"


def timing(stage: str) -> str:
    """`timing_s/<stage>`: wall seconds of one stage of one step."""
    return f"timing_s/{stage}"


# prefill dedup
PREFILL_DEDUP_RATIO = "prefill/dedup_ratio"
PREFILL_SAVED_TOKENS = "prefill/saved_tokens"

# prediction
PRED_MAE = "predictor/mae"
PRED_KENDALL = "predictor/kendall_tau"

# planning
BAL_IMBALANCE = "balancer/imbalance"
BAL_MIGRATIONS = "balancer/migrations"
SCALER_NUM_ACTORS = "scaler/num_actors"

# cost
COST_GPU_S = "cost/gpu_seconds"
COST_USD = "cost/usd"
COST_DEVICE_S = "cost/device_seconds"  # billed device-seconds (GPU-seconds on GPUs, core-seconds here)

# runtime (rlhfless.runtime): what the functions did
RUNTIME_IDLE_FRACTION = "runtime/idle_fraction"
RUNTIME_COLD_STARTS = "runtime/cold_starts"
RUNTIME_COLD_START_S = "runtime/cold_start_s"
RUNTIME_MIGRATED_SEQS = "runtime/migrated_seqs"
RUNTIME_WEIGHT_SYNC_S = "runtime/weight_sync_s"
RUNTIME_DECODE_ACTORS = "runtime/decode_actors"
RUNTIME_RETRIES = "runtime/retries"
RUNTIME_SHIP_KV = "runtime/ship_kv"
RUNTIME_SHIP_SAVED_TOKENS = "runtime/ship_saved_tokens"
RUNTIME_PLANNER_COLD_START_S = "runtime/planner_cold_start_s"  # the measured value the planner now uses
RUNTIME_PLANNER_WEIGHT_SYNC_S = "runtime/planner_weight_sync_s"
RUNTIME_TIME_MODEL_SCALE = "runtime/time_model_scale"  # measured / predicted decode busy time (smoothed)
RUNTIME_DECODE_BUSY_S = "runtime/decode_busy_s"  # this step's decode invocations' busy seconds, summed (measured)
# what the planner's base time model predicts for the same placement with the true lengths; their ratio feeds the
# time model scale above (EWMA), so the calibration can be replayed from the log alone
RUNTIME_DECODE_BUSY_MODEL_S = "runtime/decode_busy_model_s"
RUNTIME_LEARNER_EARLY = "runtime/learner_compute_before_rollout_end"  # share of the learner's group compute seconds
# finished before the last decode function of the step ended (what overlap hid under the rollout)
RUNTIME_VALUES_STREAMED = "runtime/values_chunks_streamed"  # PPO: value chunks sent while some group still decoded
RUNTIME_LEARNER_TAIL_S = "runtime/learner_tail_s"  # from the rollout's end to the optimiser step's end
RUNTIME_LEARNER_BUFFERED = "runtime/learner_buffered_peak"  # most gradients a rank held waiting for a lower chunk
RUNTIME_UNITS_PEAK = "runtime/units_peak"  # most device units held at once in the step (<= runtime.units)
RUNTIME_WINDOW_START_S = "runtime/window_start_s"  # the step's billing window, run-relative (records' clock)
RUNTIME_WINDOW_S = "runtime/window_s"  # its length: the step's bill covers it (driver work between steps included)
RUNTIME_RELEASED_MID_STEP = "runtime/released_mid_step"  # functions released mid-step: at a keep-alive lapse, or a rank at its share
RUNTIME_RANKS_RELEASED_EARLY = "runtime/ranks_released_early"  # learner ranks released at once when their share was in
RUNTIME_RELEASED_EXPIRED = "runtime/released_expired"  # functions released at their keep-alive's lapse, any time
RUNTIME_ZERO_HELD = "runtime/zero_held_intervals"  # intervals in the step with no function held at all
RUNTIME_ZERO_HELD_S = "runtime/zero_held_s"  # their seconds


def function_usage(role: str, what: str) -> str:
    """`function/<role>/<what>_s`: held device-seconds of one role in one step spent `what` (busy: computing;
    idle: held but idle, waiting or kept alive; cold: starting) (`runtime.meter.usage_window`)."""
    return f"function/{role}/{what}_s"


def function_billed(kind: str) -> str:
    """`function/<kind>/billed_s`: billed seconds of one serverless function kind in one step."""
    return f"function/{kind}/billed_s"


# GRPO/PPO loss internals (rlhfless.algo)
PG_LOSS = "actor/pg_loss"
PPO_KL = "actor/ppo_kl"
RATIO_MEAN = "actor/ratio/mean"
RATIO_MIN = "actor/ratio/min"
RATIO_MAX = "actor/ratio/max"
ADV_ABS_MEAN = "actor/advantages/abs_mean"

# PPO's critic (rlhfless.algo.ppo, rlhfless.learn.critic): verl's names where verl has one
VF_LOSS = "critic/vf_loss"
VF_CLIPFRAC = "critic/vf_clipfrac"
VPRED_MEAN = "critic/vpred_mean"
CRITIC_GRAD_NORM = "critic/grad_norm"
CRITIC_LR = "critic/lr"
VF_EXPLAINED_VAR = "critic/vf_explained_var"  # of the values that computed the advantages, against the returns
VALUES_MEAN = "critic/values/mean"
RETURNS_MEAN = "critic/returns/mean"
ADV_MEAN = "critic/advantages/mean"  # GAE advantages before whitening
KL_PENALTY = "critic/kl_penalty"  # mean per-token KL penalty taken from the reward (algo.kl_in=reward)

# planner (rlhfless.plan): balancer, migration, scaler
BAL_MAKESPAN_S = "balancer/makespan_s"
BAL_IDLE_DEVICE_S = "balancer/idle_device_s"
BAL_ACTIVE_ACTORS = "balancer/active_actors"
BAL_MIGRATED_TOKENS = "balancer/migrated_tokens"
BAL_RELEASED_ACTORS = "balancer/released_actors"
BAL_MIGRATE_USED = "balancer/migrate_used"  # 1 when the chosen plan cuts and migrates at tau (plan.migrate only)
BAL_MIGRATE_REASON = "balancer/migrate_reason"  # why the cuts were kept or not (a word: plan.scaler.CUT_REASONS)
BAL_MIGRATE_STEP_S = "balancer/migrate_predicted_step_s"  # the chosen N with cuts at tau, kept or not
BAL_MIGRATE_COST_USD = "balancer/migrate_predicted_cost_usd"
SCALER_CANDIDATES = "scaler/candidates"
SCALER_STEP_S = "scaler/predicted_step_s"
SCALER_COST_USD = "scaler/predicted_cost_usd"
SCALER_GPU_S = "scaler/predicted_gpu_seconds"
PLAN_PREDICTED_DEVICE_S = "plan/predicted_device_s"  # the chosen plan's billed device-seconds (beside cost/device_seconds)
SCALER_SCORE = "scaler/score"
SCALER_CONSTRAINT_MET = "scaler/constraint_met"
SCALER_WIDE_USED = "scaler/wide_actor_used"  # 1 when the straggler runs on the wide engine (per-actor TP)
PLAN_TIMING_S = "timing_s/plan"  # seconds the planner took for one step

# the loop's per-step planning decision scored against the true lengths (rlhfless.step.planner)
PLAN_REALIZED_MAKESPAN_S = "plan/realized_makespan_s"  # chosen placement re-simulated with the true lengths
PLAN_REALIZED_IMBALANCE = "plan/realized_imbalance"
PLAN_HINDSIGHT_MAKESPAN_S = "plan/hindsight_makespan_s"  # the same policy fed the true lengths (not a bound)
PLAN_MAKESPAN_VS_HINDSIGHT = "plan/makespan_vs_hindsight"  # realized / hindsight: what prediction error cost
PLAN_MAKESPAN_LOWER_BOUND_S = "plan/makespan_lower_bound_s"  # no plan of the true lengths on N actors beats it
PLAN_MAKESPAN_VS_LOWER_BOUND = "plan/makespan_vs_lower_bound"  # realized / bound, >= 1
