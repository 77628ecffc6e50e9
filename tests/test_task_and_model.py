import random
import statistics

import pytest
import torch

from rlhfless.core.errors import ConfigError, DataError
from rlhfless.run.pretrain import PretrainConfig, sft_chunks
from rlhfless.model.factory import (
    ModelConfig,
    build_model,
    load_checkpoint,
    save_checkpoint,
)
from rlhfless.model.tokenizer import EOS_ID, ByteTokenizer
from rlhfless.tasks.arith import (
    ArithTaskConfig,
    Problem,
    SFTStream,
    make_splits,
    sample_k,
    score,
    solution,
    split_of,
)


def test_tokenizer_round_trip_and_lengths():
    tok = ByteTokenizer()
    text = "7+3=10;#10 ünï"
    ids = tok.encode(text, bos=True, eos=True)
    assert ids[-1] == EOS_ID and tok.decode(ids) == text
    assert tok.response_length("ab") == 3


def test_solution_format_and_reward():
    p = Problem((7, 3, 1))
    assert solution(p, check=False) == "7+3=10;10+1=11;#11"
    assert solution(p, check=True) == "7+3=10;10+1=11;chk:7+3=10;10+1=11;#11"
    assert score("7+3=10;10+1=11;#11", "11", finished=True).reward == 1.0
    assert score("7+3=10;10+1=11;#12", "11", finished=True).reward == 0.0
    assert score("7+3=10;10+1=11;#11", "11", finished=False).reward == 0.0  # truncated
    assert not score("7+3=10;#1#11", "11", finished=True).well_formed


def test_splits_are_disjoint_reproducible_and_eval_does_not_depend_on_train_size():
    cfg = ArithTaskConfig(num_train=600, num_eval=200)
    a_train, a_eval = make_splits(cfg)
    b_train, b_eval = make_splits(cfg)
    assert [p.text for p in a_train] == [p.text for p in b_train]
    assert not {p.text for p in a_train} & {p.text for p in a_eval}
    _, c_eval = make_splits(ArithTaskConfig(num_train=50, num_eval=200))
    assert [p.text for p in c_eval] == [p.text for p in a_eval]
    assert max(p.meta["k"] for p in a_train) >= 10


class _RecordingStream(SFTStream):
    def next(self):
        prompt, sol = super().next()
        self.seen.add(prompt)
        return prompt, sol


def test_sft_stream_never_shows_a_train_or_eval_prompt_over_the_whole_sft_budget():
    cfg = PretrainConfig()
    stream = _RecordingStream(cfg.task, seed=cfg.seed + 1)
    stream.seen = set()
    batches = sft_chunks(stream, cfg.batch_size)
    for _ in range(cfg.steps):  # exactly what `rlhfless pretrain` consumes (sft_batches tokenizes these)
        next(batches)
    train, evals = make_splits(cfg.task)
    assert len(stream.seen) > 20_000
    assert not stream.seen & {p.text for p in train}
    assert not stream.seen & {p.text for p in evals}
    # by construction, not by luck of the draw: every SFT problem is in the SFT population
    assert {split_of(tuple(map(int, t[:-1].split("+")))) for t in stream.seen} == {"sft"}
    assert {split_of(tuple(map(int, p.text[:-1].split("+")))) for p in train} == {"train"}


def test_number_of_terms_is_heavy_tailed():
    rng = random.Random(0)
    ks = [sample_k(rng, ArithTaskConfig()) for _ in range(20000)]
    assert statistics.mean(k == 2 for k in ks) > 4 * statistics.mean(k == 8 for k in ks)
    assert statistics.mean(k >= 10 for k in ks) > 0.03


def test_sft_lengths_vary_within_a_prompt_and_have_a_tail():
    stream = SFTStream(ArithTaskConfig(), seed=0)
    lens = sorted(len(stream.next()[1]) for _ in range(4000))
    assert lens[-1] >= 5 * lens[0]
    top = lens[int(0.9 * len(lens)):]
    assert sum(top) / sum(lens) > 0.2  # the longest 10% carry well over 10% of tokens
    p = Problem((1, 2, 3, 4))
    assert len(solution(p, True)) > 1.5 * len(solution(p, False))


def test_task_config_rejects_bad_values():
    with pytest.raises(ConfigError, match="task.arith.check_prob"):
        ArithTaskConfig(check_prob=1.5)
    with pytest.raises(ConfigError, match="task.arith.k_max"):
        ArithTaskConfig(k_min=5, k_max=3)


def test_checkpoint_round_trip_keeps_tied_head(tmp_path):
    model = build_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                    intermediate_size=64), seed=3)
    save_checkpoint(model, tmp_path / "ck")
    assert not list((tmp_path / "ck").glob("*.bin")) and not list((tmp_path / "ck").glob("*.pt"))
    loaded = load_checkpoint(tmp_path / "ck")
    x = torch.randint(3, 200, (2, 9))
    assert torch.equal(model(x).logits, loaded(x).logits)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="rlhfless pretrain"):
        load_checkpoint(tmp_path / "nothing")


def test_model_config_validation():
    with pytest.raises(ConfigError, match="model.num_heads"):
        ModelConfig(hidden_size=30, num_heads=4)
