"""Training pairs and GRPO training of an LLM surrogate, with a tiny model built here (no downloads).

The tiny model is a 2-layer Llama with a byte-level BPE tokenizer trained on the prompts it
will read (so that a prompt is a few hundred tokens). Eight extra tokens each spell the rest
of one answer after its opening (most probability on one bin), and its output layer gives
every other token a zero logit: a random model then answers in parseable JSON most of the
time, with answers that differ between prompts and samples, so the rewards vary within a
GRPO group and the adapter really trains. One run goes through
``kernelcast pairs`` and ``kernelcast train --surrogate llm-grpo`` (a Prefect flow on a
temporary server) into a real SQLite MLflow store; the tests read what it left.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kernelcast.storage.dataset import DataRoot
from kernelcast.surrogate.bins import speedup_bin
from kernelcast.surrogate.dataset import case_pairs, requests_from, source_pairs, source_requests
from kernelcast.surrogate.grpo import (ANSWER_OPENING, PARSE_FAILURE, REWARDS, SFT_FAILED_RANGE, SFT_RAN_RANGE, GRPOSettings,
                            correctness, hundredths, one_minus_brier,
                            one_minus_crps, outcome_reward, outcomes, render_prompt, reward, sft_probabilities,
                            sft_target)
from kernelcast.surrogate.llm import build_messages, parse_answer, parse_probabilities
from kernelcast.surrogate.pairs import (CorpusSettings, PairSettings, balanced, build_pairs, corpus_pairs, read_pairs, request_of,
                             requests_of, write_pairs)

pytest.importorskip("trl")
POOL = Path(__file__).resolve().parents[1] / "data" / "pools"
CORPUS = POOL / "llm"
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _answer_tail(b: int) -> str:
    """What follows ANSWER_OPENING in an answer that the kernel runs, with most probability on bin ``b``."""
    probabilities = [0.05] * 8
    probabilities[b - 1] = 0.65
    return '0.05, "probabilities": ' + json.dumps(probabilities) + "}"


# ---------------------------------------------------------------- rewards

CORRECT = '{"probabilities": [0, 0, 0, 0.5, 0.5, 0, 0, 0]}'  # ties go to the lower bin, as argmax does
CONFIDENT_WRONG = '{"probabilities": [0, 0, 0, 0, 0, 0, 0, 1]}'
UNNORMALISED = 'Memory-bound. {"probabilities": [2, 2, 0, 0, 0, 0, 0, 0]}'


@pytest.mark.parametrize("answer, true_bin, expected", [
    # Over the 9 outcomes 0..8 (P(fail) 0: the answer names none); CRPS sums 8 CDF steps.
    # Brier: (0.5 - 1)^2 + 0.5^2 = 0.5. CRPS: the CDF misses the step at bin 4 by 0.5 -> 0.25 / 8.
    (CORRECT, 4, {"correctness": 1.0, "brier": 1.0 + 0.5, "crps": 1.0 + 1 - 0.25 / 8}),
    # Brier: 1^2 + 1^2 = 2. CRPS: the CDF is 0 at bins 2..7 where the truth is 1 -> 6 / 8.
    (CONFIDENT_WRONG, 2, {"correctness": 0.0, "brier": 0.0 + 1 - 2.0, "crps": 0.0 + 1 - 6 / 8}),
    # Renormalised to [0.5, 0.5, 0, ...]: Brier 0.25 + 0.25; CRPS 0.5^2 at bin 1 -> 0.25 / 8.
    (UNNORMALISED, 1, {"correctness": 1.0, "brier": 1.0 + 0.5, "crps": 1.0 + 1 - 0.25 / 8}),
    # A failed pair (bin 0): an answer that names no failure says the kernel runs, so it is wrong.
    # Brier: 1^2 (bin 0) + 0.5^2 + 0.5^2 = 1.5. CRPS: the truth's CDF is 1 from bin 0 on; the
    # answer's is 0 at bins 0..3 and 0.5 at bin 4 -> (4 + 0.25) / 8.
    (CORRECT, 0, {"correctness": 0.0, "brier": 0.0 + 1 - 1.5, "crps": 0.0 + 1 - 4.25 / 8}),
    # Brier: 1 + 1 = 2. CRPS: the answer's CDF is 0 at bins 0..7 -> 8 / 8.
    (CONFIDENT_WRONG, 0, {"correctness": 0.0, "brier": 0.0 + 1 - 2.0, "crps": 0.0 + 1 - 1.0}),
])
def test_rewards_match_hand_computed_values(answer, true_bin, expected):
    for name, value in expected.items():
        assert reward(name, [answer], [true_bin]) == [pytest.approx(value)], name


@pytest.mark.parametrize("answer", ["bin 4, I think", '{"probabilities": [0.1, 0.2', "",
                                    '{"probabilities": [0.5, 0.5]}', '{"probabilities": [-1, 2, 0, 0, 0, 0, 0, 0]}'])
def test_an_answer_that_does_not_parse_scores_below_every_parsed_answer(answer):
    for fn in (correctness, one_minus_brier, one_minus_crps):
        assert fn([answer], [3]) == [0.0]
    for name in REWARDS:  # the worst parsed answers: confident and wrong, or spread evenly, for every true bin
        worst = min(reward(name, [parsed], [b])[0] for parsed in (CONFIDENT_WRONG, CORRECT, UNNORMALISED)
                    for b in range(0, 9))
        assert reward(name, [answer], [3]) == [PARSE_FAILURE] and PARSE_FAILURE < worst, name


@pytest.mark.parametrize("outcome, true_bin, expected", [
    # Most mass on failure, and the pair failed. Brier: 0.3^2 + 0.3^2 = 0.18. CRPS: the CDF is 0.7
    # at bins 0..3 where the truth's is 1 -> 4 * 0.09 / 8 = 0.045.
    ([0.7, 0, 0, 0, 0.3, 0, 0, 0, 0], 0, {"correctness": 1.0, "brier": 1.0 + 1 - 0.18, "crps": 1.0 + 1 - 0.045}),
    # Most mass on bin 4, and the pair failed. Brier: 0.8^2 + 0.8^2 = 1.28. CRPS: 4 * 0.8^2 / 8 = 0.32.
    ([0.2, 0, 0, 0, 0.8, 0, 0, 0, 0], 0, {"correctness": 0.0, "brier": 0.0 + 1 - 1.28, "crps": 0.0 + 1 - 0.32}),
    # The same answer on a pair that ran in bin 4. Brier: 0.2^2 + 0.2^2 = 0.08. CRPS: the CDF is 0.2
    # at bins 0..3 where the truth's is 0 -> 4 * 0.04 / 8 = 0.02.
    ([0.2, 0, 0, 0, 0.8, 0, 0, 0, 0], 4, {"correctness": 1.0, "brier": 1.0 + 1 - 0.08, "crps": 1.0 + 1 - 0.02}),
])
def test_rewards_score_failure_as_the_ninth_outcome(outcome, true_bin, expected):
    for name, value in expected.items():
        assert outcome_reward(name, [outcome], [true_bin]) == [pytest.approx(value)], name


@pytest.mark.parametrize("answer", [CORRECT, CONFIDENT_WRONG, UNNORMALISED])
def test_rewards_of_answers_are_the_rewards_of_their_outcomes(answer):
    for name in REWARDS:
        for true_bin in range(9):
            assert reward(name, [answer], [true_bin]) == \
                pytest.approx(outcome_reward(name, outcomes(answer), [true_bin])), (name, true_bin)


def test_no_parsed_answer_scores_as_low_as_a_parse_failure_on_any_true_bin():
    rng = np.random.default_rng(0)
    answers = np.vstack([np.eye(9), rng.dirichlet(np.full(9, 0.3), 500), np.full((1, 9), 1 / 9)])
    for name in REWARDS:
        for true_bin in range(9):
            worst = min(outcome_reward(name, answers, [true_bin] * len(answers)))
            assert worst > PARSE_FAILURE, (name, true_bin, worst)


def test_rewards_read_the_answer_after_its_prefix():
    assert reward("crps", [' 0, "probabilities": [0, 0, 0, 1, 0, 0, 0, 0]}', "0, 1]}"], [4, 4],
                  answer_prefix=ANSWER_OPENING) == [2.0, PARSE_FAILURE]
    assert correctness(['0, "probabilities": [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.3]}'], [8],
                       answer_prefix=[ANSWER_OPENING]) == [1.0]
    assert correctness(['0.8, "probabilities": [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.3]}'], [0],
                       answer_prefix=[ANSWER_OPENING]) == [1.0]  # the failure it states, read after the opening


def test_the_model_reads_the_chat_template_then_the_answer_opening(pool_pairs, tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, "<unk>")),
                                        unk_token="<unk>", chat_template=CHAT_TEMPLATE)
    messages = build_messages(request_of(pool_pairs.iloc[0]))
    text = render_prompt(tokenizer, messages, ANSWER_OPENING)
    assert text == (f"<|im_start|>system\n{messages[0]['content']}<|im_end|>\n"
                    f"<|im_start|>user\n{messages[1]['content']}<|im_end|>\n<|im_start|>assistant\n{ANSWER_OPENING}")


def test_rewards_read_chat_completions_as_trl_passes_them():
    chat = [[{"role": "assistant", "content": CORRECT}], [{"role": "assistant", "content": "no idea"}]]
    assert reward("brier", chat, [4, 4]) == [pytest.approx(1.5), PARSE_FAILURE]


def test_unknown_reward_and_missing_model_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="unknown reward 'ece'; known: correctness, brier, crps"):
        GRPOSettings(model=str(tmp_path), reward="ece")
    with pytest.raises(ValueError, match="no-such-model.gguf"):
        GRPOSettings(model=str(tmp_path / "no-such-model.gguf"))
    with pytest.raises(ValueError, match="num_generations must be at least 2"):
        GRPOSettings(model=str(tmp_path), num_generations=1)


# ---------------------------------------------------------------- warm-up targets


@pytest.mark.parametrize("true_bin, expected", [
    # 0.35 over the other bins by 2^-distance, in hundredths, largest remainders rounded up:
    # bin 4: weights 1/8, 1/4, 1/2 | 1/2, 1/4, 1/8, 1/16 (sum 1.8125) -> 2.41, 4.83, 9.66 | 9.66, 4.83, 2.41, 1.21.
    (4, [0.02, 0.05, 0.10, 0.65, 0.10, 0.05, 0.02, 0.01]),
    # bin 1: weights 1/2 ... 1/128 (sum 0.9921875) -> 17.64, 8.82, 4.41, 2.20, 1.10, 0.55, 0.28.
    (1, [0.65, 0.18, 0.09, 0.04, 0.02, 0.01, 0.01, 0.00]),
    (8, [0.00, 0.01, 0.01, 0.02, 0.04, 0.09, 0.18, 0.65]),
])
def test_warm_up_targets_are_smoothed_around_the_true_bin(true_bin, expected):
    assert sft_probabilities(true_bin) == pytest.approx(expected)
    text = ", ".join(f"{p:.2f}" for p in expected)
    assert sft_target(true_bin, ANSWER_OPENING) == '0.05, "probabilities": [' + text + "]}"
    assert sft_target(true_bin) == '{"failure": 0.05, "probabilities": [' + text + "]}"


def test_a_failed_pairs_warm_up_target_says_it_fails_and_leaves_the_bins_flat():
    assert sft_target(0) == '{"failure": 0.90, "probabilities": [0.13, 0.13, 0.12, 0.12, 0.13, 0.13, 0.12, 0.12]}'
    answer = parse_answer(ANSWER_OPENING + sft_target(0, ANSWER_OPENING))
    assert answer.failure == pytest.approx(0.9) and answer.raw_sum == pytest.approx(1.0)


@pytest.mark.parametrize("true_bin", range(0, 9))
def test_warm_up_targets_parse_to_their_true_bin(true_bin):
    for prefix in (ANSWER_OPENING, '{"failure": 0.', ""):
        probabilities, raw_sum = parse_probabilities(prefix + sft_target(true_bin, prefix))
        assert raw_sum == pytest.approx(1.0)
        assert true_bin == 0 or int(np.argmax(probabilities)) + 1 == true_bin
        assert correctness([sft_target(true_bin, prefix)], [true_bin], answer_prefix=[prefix]) == [1.0]
    with pytest.raises(ValueError, match="does not continue the answer prefix"):
        sft_target(true_bin, "Answer: ")


@pytest.mark.parametrize("true_bin", range(0, 9))
def test_drawn_warm_up_targets_differ_but_keep_their_shape_and_parse(true_bin):
    rng = np.random.default_rng(7)
    texts = [sft_target(true_bin, ANSWER_OPENING, rng) for _ in range(40)]
    assert len(set(texts)) > 30  # a model taught these has no single answer to learn by heart
    for text in texts:
        answer = parse_answer(ANSWER_OPENING + text)
        assert answer.raw_sum == pytest.approx(1.0)
        low, high = SFT_FAILED_RANGE if true_bin == 0 else SFT_RAN_RANGE
        assert low - 0.005 <= answer.failure <= high + 0.005
        if true_bin:  # the true bin keeps the most mass, so correctness scores every target 1
            assert int(np.argmax(answer.probabilities)) + 1 == true_bin
        assert correctness([text], [true_bin], answer_prefix=[ANSWER_OPENING]) == [1.0]
    again = np.random.default_rng(7)
    assert [sft_target(true_bin, ANSWER_OPENING, again) for _ in range(40)] == texts  # seeded


def test_hundredths_round_to_a_distribution_and_refuse_nonsense():
    assert hundredths([1, 1, 1]) == [0.34, 0.33, 0.33]
    assert sum(hundredths(np.random.default_rng(0).dirichlet(np.ones(8)))) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="positive sum"):
        hundredths([0, 0])


# ---------------------------------------------------------------- pairs


@pytest.fixture(scope="module")
def pool_pairs() -> pd.DataFrame:
    return build_pairs(DataRoot(str(POOL)), PairSettings(per_op=64, gpu_type="h100", eval_ops=("rmsnorm", "row_sum")))


def test_balanced_sampling_takes_bins_in_turn_and_keeps_rare_bins_whole():
    frame = pd.DataFrame({"true_bin": [1] * 100 + [2] * 10 + [3] * 2})
    taken = balanced(frame, 12, np.random.default_rng(0))
    assert taken["true_bin"].value_counts().to_dict() == {1: 5, 2: 5, 3: 2}


def test_pairs_hold_out_whole_operations(pool_pairs):
    held = set(pool_pairs.loc[pool_pairs["split"] == "eval", "op"])
    trained = set(pool_pairs.loc[pool_pairs["split"] == "train", "op"])
    assert held == {"rmsnorm", "row_sum"} and not held & trained and len(trained) == 8


def test_pairs_split_each_operations_quota_between_reference_and_parent_anchors(pool_pairs):
    counts = pool_pairs.groupby(["op", "anchor_kind"]).size()
    assert (counts == 32).all() and len(counts) == 2 * pool_pairs["op"].nunique()
    parents = pool_pairs[pool_pairs["anchor_kind"] == "parent"]
    assert (parents["anchor_id"] != parents["candidate_id"]).all()
    assert (parents["anchor_origin"] != "seed").all()
    assert (pool_pairs.loc[pool_pairs["anchor_kind"] == "reference", "anchor_origin"] == "seed").all()


def test_pairs_are_flatter_over_bins_than_the_measured_pool(pool_pairs):
    natural = case_pairs(DataRoot(str(POOL)), gpu_type="h100", op="softmax")["true_bin"].value_counts(normalize=True)
    drawn = pool_pairs[(pool_pairs["anchor_kind"] == "reference") & (pool_pairs["op"] == "softmax")]
    assert drawn["true_bin"].value_counts(normalize=True).max() < natural.max()


def test_pair_true_bin_is_the_bin_of_anchor_over_candidate_runtime(pool_pairs):
    m = DataRoot(str(POOL)).read_measurements(gpu_type="h100").set_index("candidate_id")
    for row in pool_pairs.sample(20, random_state=1).to_dict("records"):
        (case,) = row["case_names"]
        at = list(m.loc[row["candidate_id"], "case_names"]).index(case)
        anchor = m.loc[row["anchor_id"], "runtime_us_median"][at]
        candidate = m.loc[row["candidate_id"], "runtime_us_median"][at]
        assert list(row["anchor_runtime_us"]) == [anchor] and list(row["runtime_us"]) == [candidate]
        assert row["speedup"] == pytest.approx(anchor / candidate) and row["status"] == "ok"
        assert row["true_bin"] == speedup_bin(anchor / candidate)


def test_a_reference_pair_asks_exactly_the_forecasters_prompt(pool_pairs):
    row = pool_pairs[pool_pairs["anchor_kind"] == "reference"].iloc[0]
    cases = case_pairs(DataRoot(str(POOL)), gpu_type="h100", op=row["op"])
    same = cases[(cases["candidate_id"] == row["candidate_id"]) & (cases["case_name"] == row["case_names"][0])]
    assert build_messages(request_of(row)) == build_messages(requests_from(same)[0])


def test_pairs_round_trip_through_parquet_and_other_files_are_refused(pool_pairs, tmp_path):
    write_pairs(pool_pairs, str(tmp_path / "pairs.parquet"))
    back = read_pairs(str(tmp_path / "pairs.parquet"))
    pd.testing.assert_frame_equal(back, pool_pairs, check_dtype=False)
    assert [r.candidate.candidate_id for r in requests_of(back.head(5))] == list(back["candidate_id"].head(5))
    pool_pairs.drop(columns=["true_bin"]).to_parquet(tmp_path / "other.parquet")
    with pytest.raises(ValueError, match="lacks the column.* true_bin"):
        read_pairs(str(tmp_path / "other.parquet"))


# ---------------------------------------------------------------- pairs from the LLM corpus


@pytest.fixture(scope="module")
def corpus() -> pd.DataFrame:
    return corpus_pairs(DataRoot(str(CORPUS)), CorpusSettings(eval_ops=("softmax", "transpose")))


def test_corpus_pairs_hold_out_whole_operations(corpus):
    held = set(corpus.loc[corpus["split"] == "eval", "op"])
    trained = set(corpus.loc[corpus["split"] == "train", "op"])
    assert held == {"softmax", "transpose"} and trained and not held & trained
    drawn = [corpus_pairs(DataRoot(str(CORPUS)), CorpusSettings(seed=3)) for _ in range(2)]
    pd.testing.assert_frame_equal(*drawn)  # the same held-out operations, and the same failures kept
    assert drawn[0].loc[drawn[0]["split"] == "eval", "op"].nunique() == 2


def test_corpus_failures_are_capped_in_training_only(corpus):
    children = source_pairs(DataRoot(str(CORPUS)), gpu_type="h100", anchor="parent")
    train, held = corpus[corpus["split"] == "train"], corpus[corpus["split"] == "eval"]
    assert (train["true_bin"] == 0).mean() <= 0.5 < (children["true_bin"] == 0).mean()
    assert (train["true_bin"] == 0).sum() == (train["true_bin"] > 0).sum()  # as many as the cap allows
    # The held-out operations keep every child, failures included: the mix a search meets.
    of_held = children[children["op"].isin(["softmax", "transpose"])]
    assert sorted(held["candidate_id"]) == sorted(of_held["candidate_id"])
    uncapped = corpus_pairs(DataRoot(str(CORPUS)), CorpusSettings(eval_ops=("softmax", "transpose"),
                                                                   max_failure_share=1.0))
    assert len(uncapped) == len(children) and set(corpus["candidate_id"]) < set(uncapped["candidate_id"])


@pytest.mark.parametrize("child, parent, status, true_bin", [
    # Parent over child runtime per case, 72.784/72.896, 112.736/113.072, 120.688/120.416: geometric mean 0.9992.
    ("1c13d279f9da257b", "1a5757ac558eadbc", "ok", 4),
    # 72.784/71.856, 112.736/112.336, 120.688/112.896: geometric mean 1.028.
    ("1fb83da7e25df90b", "1a5757ac558eadbc", "ok", 5),
    ("08fcbcea547ccb71", "1a5757ac558eadbc", "incorrect", 0),  # a wrong result: failure, whatever its speed
])
def test_corpus_pairs_anchor_each_child_at_its_parent_with_its_true_bin(child, parent, status, true_bin):
    pairs = corpus_pairs(DataRoot(str(CORPUS)), CorpusSettings(eval_ops=("bias_gelu",)))
    (row,) = pairs[pairs["candidate_id"] == child].to_dict("records")
    assert (row["anchor_id"], row["status"], row["true_bin"], row["split"]) == (parent, status, true_bin, "eval")
    assert row["anchor_kind"] == "parent" and row["candidate_origin"] == "llm" and len(row["case_names"]) == 3
    assert math.isnan(row["speedup"]) == (true_bin == 0)


def test_every_corpus_pair_is_anchored_at_the_parent_its_child_was_written_from(corpus):
    root = DataRoot(str(CORPUS))
    written = root.read("provenance").drop_duplicates("candidate_id", keep="last").set_index("candidate_id")
    assert (corpus["anchor_id"] == corpus["candidate_id"].map(written["parent_id"])).all()
    assert (corpus["true_bin"] == 0).eq(corpus["status"] != "ok").all()
    ran = corpus[corpus["status"] == "ok"]
    assert [speedup_bin(s) for s in ran["speedup"]] == list(ran["true_bin"])


def test_a_corpus_pair_asks_the_prompt_of_the_source_forecasters_request(corpus):
    children = source_pairs(DataRoot(str(CORPUS)), gpu_type="h100", anchor="parent").set_index("candidate_id")
    for row in corpus.sample(5, random_state=0).to_dict("records"):
        (request,) = source_requests(children.loc[[row["candidate_id"]]].reset_index())
        assert build_messages(request_of(row)) == build_messages(request)


def test_pairs_command_writes_corpus_pairs_as_json_lines(corpus, tmp_path, capsys):
    from kernelcast.flows.cli import main

    out = tmp_path / "corpus.jsonl"
    assert main(["pairs", "--corpus", "--data", str(CORPUS), "--eval-ops", "softmax,transpose",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{len(corpus)} pairs written to {out}; held out for evaluation: softmax, transpose" in printed
    first = json.loads(out.read_text().splitlines()[0])
    assert first["runtime_us"] == [None, None, None] or all(isinstance(t, float) for t in first["runtime_us"])
    pd.testing.assert_frame_equal(read_pairs(str(out)), corpus, check_dtype=False)
    assert [r.candidate.candidate_id for r in requests_of(read_pairs(str(out)).head(3))] == \
        list(corpus["candidate_id"].head(3))
    assert main(["pairs", "--corpus", "--data", str(CORPUS), "--out", str(out), "--per-op", "4"]) == 2
    assert "--per-op: only without --corpus" in capsys.readouterr().err


# ---------------------------------------------------------------- GRPO on a tiny model


def _tiny_model(folder: Path, pairs: pd.DataFrame) -> None:
    """A 2-layer Llama and a byte-level BPE tokenizer trained on the pairs' prompts, saved to ``folder``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    texts = [m["content"] for r in requests_of(pairs) for m in build_messages(r)]
    bpe = Tokenizer(models.BPE())
    # Merges may cross spaces (not lines): the prompts' shared text becomes a few hundred tokens, so
    # the tiny model reads each prompt in about 200 tokens rather than 2000.
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split("\n", behavior="merged_with_previous"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=8192, special_tokens=["<pad>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                        pad_token="<pad>", chat_template=CHAT_TEMPLATE)
    tokens = [_answer_tail(b) for b in range(1, 9)]
    tokenizer.add_tokens(tokens)
    answers = tokenizer.convert_tokens_to_ids(tokens)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=8192, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id))
    with torch.no_grad():
        head = torch.zeros_like(model.lm_head.weight)
        head[answers] = torch.randn(len(answers), head.shape[1])
        model.lm_head.weight.copy_(head)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@pytest.fixture(scope="module")
def trained(prefect_server, tmp_path_factory):
    """``kernelcast pairs`` then ``kernelcast train --surrogate llm-grpo`` on the tiny model, through Prefect."""
    from kernelcast.flows.cli import main

    where = tmp_path_factory.mktemp("grpo")
    pairs_file, out, model = where / "pairs.parquet", where / "run", where / "tiny"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["pairs", "--data", str(POOL), "--out", str(pairs_file), "--gpu-type", "h100", "--per-op", "4",
                     "--eval-ops", "rmsnorm"]) == 0
    pairs = read_pairs(str(pairs_file))
    _tiny_model(model, pairs)
    tracking = f"sqlite:///{where / 'mlflow.db'}"
    with contextlib.redirect_stdout(printed):
        code = main(["train", "--surrogate", "llm-grpo", "--model", str(model), "--pairs", str(pairs_file),
                     "--reward", "crps", "--steps", "2", "--num-generations", "2", "--batch-size", "2",
                     "--max-completion-tokens", "4", "--lora-rank", "4", "--learning-rate", "1e-2",
                     "--eval-pairs", "0", "--sft-steps", "2", "--sft-learning-rate", "1e-3",
                     "--out", str(out), "--tracking-uri", tracking])
    assert code == 0, printed.getvalue()[-3000:]
    return {"pairs": pairs, "out": out, "model": model, "tracking": tracking, "printed": printed.getvalue()}


def _run(trained):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=trained["tracking"])
    experiment = client.get_experiment_by_name("surrogate-grpo")
    (run,) = client.search_runs([experiment.experiment_id])
    return client, run


def test_train_command_prints_the_before_and_after_table(trained):
    text = trained["printed"]
    assert "held out for evaluation: rmsnorm" in text
    assert "before" in text and "after" in text and "spearman" in text and "pairs/s" in text


def test_grpo_logs_reward_loss_and_evaluation_metrics_to_mlflow(trained):
    client, run = _run(trained)
    logged = run.data.metrics
    for key in ("train.loss", "train.reward", "train.rewards/correctness/mean", "train.rewards/one_minus_crps/mean",
                "train.grad_norm", "train.pairs_per_second", "train.completions_per_second"):
        assert key in logged, key
    for label in ("before", "after_sft", "after"):
        # Spearman and Kendall are left out: undefined (NaN, not logged) when every answer is the same bin.
        for metric in ("bin_accuracy", "ece", "brier", "crps", "nll", "parse_rate", "aurc"):
            assert f"{label}.{metric}" in logged, f"{label}.{metric}"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train.loss")] == [1, 2]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "sft.loss")] == [1, 2]
    assert run.data.params["sft_steps"] == "2"
    # The tiny model answers in JSON: its answers parse and earn the CRPS term.
    assert logged["before.parse_rate"] > 0.5
    assert max(m.value for m in client.get_metric_history(run.info.run_id, "train.rewards/one_minus_crps/mean")) > 0
    assert run.data.params["reward"] == "crps" and run.data.params["eval_ops"] == "rmsnorm"
    assert run.info.status == "FINISHED"
    assert "adapter/adapter_model.safetensors" in [a.path for a in client.list_artifacts(run.info.run_id, "adapter")]


def test_grpo_writes_metrics_and_the_evaluation_to_its_folder(trained):
    steps = [json.loads(line) for line in (trained["out"] / "metrics.jsonl").read_text().splitlines()]
    assert any("train.loss" in s for s in steps) and any("after.ece" in s for s in steps)
    evaluation = json.loads((trained["out"] / "evaluation.json").read_text())
    assert evaluation["eval_pairs"] == (trained["pairs"]["split"] == "eval").sum()
    assert evaluation["train_pairs"] == (trained["pairs"]["split"] == "train").sum()
    assert evaluation["pairs_per_second"] > 0
    assert evaluation["steps"] == 2 and evaluation["sft_steps"] == 2 and len(evaluation["sft_loss"]) == 2
    for label in ("before", "after_sft", "after"):
        assert {"bin_accuracy", "spearman", "kendall", "ece", "brier", "crps", "parse_rate"} <= set(evaluation[label])


def test_the_adapter_trained_and_its_checkpoint_reproduces_the_after_evaluation(trained):
    from kernelcast.surrogate.grpo import TransformersForecaster, evaluate_pairs, load_adapter

    model, tokenizer = load_adapter(str(trained["model"]), str(trained["out"] / "adapter"))
    lora_b = [p for name, p in model.named_parameters() if "lora_B" in name]
    assert lora_b and any(float(p.abs().sum()) > 0 for p in lora_b)  # LoRA B starts at zero: training moved it
    held_out = trained["pairs"][trained["pairs"]["split"] == "eval"]
    again = evaluate_pairs(TransformersForecaster(model, tokenizer, max_new_tokens=4, answer_prefix=ANSWER_OPENING),
                           held_out)
    after = json.loads((trained["out"] / "evaluation.json").read_text())["after"]
    for metric in ("bin_accuracy", "brier", "crps", "ece", "parse_rate"):
        assert math.isclose(again[metric], after[metric], abs_tol=1e-9), metric


def test_a_few_warm_up_steps_lower_the_warm_up_loss(trained, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model

    from kernelcast.surrogate.grpo import load_model, sft_batch, warm_up

    model, tokenizer = load_model(str(trained["model"]))
    with torch.no_grad():  # a head that reads every token, so that the adapter can move the whole answer
        model.lm_head.weight.copy_(torch.randn_like(model.lm_head.weight) * 0.3)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    train = trained["pairs"][trained["pairs"]["split"] == "train"]
    batch = sft_batch(tokenizer, train.head(2).to_dict("records"), ANSWER_OPENING, 96)
    target = batch["labels"][0][batch["labels"][0] != -100].tolist()
    # The loss is on the target's tokens only: the answer after the opening, then EOS.
    assert tokenizer.decode(target[:-1]) == sft_target(int(train.iloc[0]["true_bin"]), ANSWER_OPENING)
    assert target[-1] == tokenizer.eos_token_id
    # Fixed targets: drawn ones (the default) keep the loss higher, by design.
    settings = GRPOSettings(model=str(trained["model"]), sft_steps=8, sft_learning_rate=1e-2, batch_size=2,
                            sft_jitter=False, out_dir=str(tmp_path))
    losses = warm_up(model, tokenizer, train.head(4), settings)
    assert len(losses) == 8 and losses[-1] < 0.7 * losses[0], losses


def test_a_grpo_step_on_corpus_pairs_scores_failed_children(trained, tmp_path, capsys):
    from benchmarks.grpo_smollm2 import main as benchmark

    assert benchmark(["--out", str(tmp_path), "--model-file", str(trained["model"]), "--pairs", "corpus",
                      "--rewards", "crps", "--steps", "1", "--num-generations", "2", "--batch-size", "2",
                      "--max-completion-tokens", "4", "--lora-rank", "4", "--eval-pairs", "8",
                      "--eval-batch-size", "8", "--sft-steps", "1"]) == 0
    assert "failure_auroc" in capsys.readouterr().out
    report = json.loads((tmp_path / "grpo_smollm2.json").read_text())
    pairs = read_pairs(str(tmp_path / "pairs.parquet"))
    assert report["eval_ops"] == ["softmax", "transpose"] and (pairs["true_bin"] == 0).any()
    run = report["runs"]["crps"]
    assert run["steps"] == 1 and run["train_pairs"] == (pairs["split"] == "train").sum() and run["eval_pairs"] == 8
    assert run["sft_steps"] == 1  # the warm-up trains on every training pair, failed children included
    for label in ("before", "after_sft", "after"):  # held-out pairs with failures: scored over bins 0..8
        assert {"failure_auroc", "spearman_valid", "bin_accuracy", "ece", "brier", "crps", "parse_rate"} <= \
            set(run[label]), label
    steps = [json.loads(line) for line in (tmp_path / "crps" / "metrics.jsonl").read_text().splitlines()]
    assert any("train.rewards/one_minus_crps/mean" in s for s in steps)


def test_train_command_asks_for_a_model_before_starting_anything(capsys):
    from kernelcast.flows.cli import main

    assert main(["train", "--surrogate", "llm-grpo"]) == 2
    assert "--surrogate llm-grpo needs --model" in capsys.readouterr().err


def test_an_unknown_precision_is_refused_by_name():
    from kernelcast.surrogate.grpo import load_model

    with pytest.raises(ValueError, match="unknown precision 'fp8'; known: bf16, fp32"):
        load_model("model.gguf", "fp8")


def test_the_comparison_scores_a_source_forecaster_on_the_models_held_out_pairs(tmp_path):
    from benchmarks.grpo_smollm2 import main as grpo_main

    assert grpo_main(["--pairs", "corpus", "--eval-pairs", "40", "--compare", "source", "--compare-only",
                      "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "compared.json").read_text())
    scores = report["compared"]["source"]
    assert report["eval_ops"] == ["softmax", "transpose"] and scores["n"] == 40
    assert scores["parse_rate"] == 1.0 and scores["failure_auroc"] > 0.7  # fit on other operations only
    with pytest.raises(SystemExit):
        grpo_main(["--pairs", "template", "--compare", "source", "--compare-only", "--out", str(tmp_path)])
