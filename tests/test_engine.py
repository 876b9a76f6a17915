"""The batched generation engine (``python -m kernelcast.infra.engine``) as a real server process on loopback.

It serves a tiny random-weight qwen2 model that this file writes with the ``gguf`` package:
a byte-level BPE vocabulary with ChatML's special tokens, a chat template in its metadata,
and end-of-turn tokens that the output layer never favours, so a reply runs to max_tokens
unless a stop string ends it. Transformers loads it as it loads a Qwen2.5 GGUF.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from kernelcast.surrogate.llm import OpenAIChat

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = 512
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte, the alphabet of a byte-level BPE vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_tiny_qwen2_gguf(path, *, chat_template: str | None = TEMPLATE) -> None:
    """A 2-layer qwen2 model, 64 wide, with byte-level tokens, a few merges and ChatML's special tokens."""
    import gguf

    rng = np.random.default_rng(0)
    n_embd, n_ff, n_head, n_kv = 64, 128, 4, 2
    merges = ["Ġ t", "Ġ a", "i n", "e r", "o n"]
    tokens = _byte_chars() + [m.replace(" ", "") for m in merges] + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    specials = range(len(tokens) - 3, len(tokens))
    types = [gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL for i in range(len(tokens))]

    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("kernelcast-tiny-qwen2")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(n_embd)
    w.add_block_count(2)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(specials[0])
    w.add_pad_token_id(specials[0])
    w.add_eos_token_id(specials[2])
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def weight(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    output = weight(len(tokens), n_embd, scale=1.0)
    output[list(specials)] = 0.0  # logit 0 among logits spread ~8 wide: an end token is (almost) never drawn
    w.add_tensor("token_embd.weight", weight(len(tokens), n_embd, scale=1.0))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", output)
    kv = n_kv * n_embd // n_head
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name, rows in (("attn_q", n_embd), ("attn_k", kv), ("attn_v", kv)):
            w.add_tensor(f"blk.{i}.{name}.weight", weight(rows, n_embd))
            w.add_tensor(f"blk.{i}.{name}.bias", weight(rows, scale=0.02))
        w.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EngineServer:
    """``python -m kernelcast.infra.engine`` as a child process on a free loopback port."""

    def __init__(self, model_path, *extra: str):
        self.port = _free_port()
        self.root_url = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.root_url}/v1"
        self.log = open(f"{model_path}.{self.port}.log", "w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kernelcast.infra.engine", "--model", str(model_path), "--port", str(self.port),
             "--threads", "1", *extra], cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 120.0) -> "EngineServer":
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"the engine exited with {self.process.returncode}:\n{self.log.read()[-3000:]}")
            try:
                if get(f"{self.root_url}/health")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the engine did not answer {self.root_url}/health within {timeout_s} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def get(url: str) -> tuple[int, dict]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, json.loads(r.read())


def post(url: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def chat(server: EngineServer, content: str, **fields) -> dict:
    status, answer = post(f"{server.base_url}/chat/completions",
                          {"model": "tiny", "messages": [{"role": "user", "content": content}], **fields})
    assert status == 200, answer
    return answer


def text_of(answer: dict) -> str:
    return answer["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    pytest.importorskip("gguf")
    path = tmp_path_factory.mktemp("engine") / "tiny.gguf"
    write_tiny_qwen2_gguf(path)
    return path


@pytest.fixture(scope="module")
def server(tiny_model):
    # On the CPU in float32 wherever the tests run, so that a seed's text is exactly reproducible; a long
    # gathering window, so that the tests' concurrent requests land in one batch even on a busy machine.
    running = EngineServer(tiny_model, "--device", "cpu", "--max-batch", "16", "--gather-ms", "300").wait_ready()
    yield running
    running.stop()


# ---------------------------------------------------------------------------------------- routes


def test_models_lists_the_served_model_and_the_repo_client_probes_it(server):
    pytest.importorskip("httpx")
    status, listed = get(f"{server.base_url}/models")
    assert status == 200
    assert [m["id"] for m in listed["data"]] == ["tiny"]
    OpenAIChat(server.base_url, "tiny").probe()


def test_health_answers_ok(server):
    assert get(f"{server.root_url}/health") == (200, {"status": "ok"})


def test_the_repo_client_gets_a_reply(server):
    httpx = pytest.importorskip("httpx")

    client = OpenAIChat(server.base_url, "tiny")
    with httpx.Client(timeout=60) as http:
        reply = client.chat(http, [{"role": "system", "content": "You write kernels."},
                                   {"role": "user", "content": "Write a softmax."}], temperature=0.0, max_tokens=6)
    assert isinstance(reply, str) and reply


def test_a_reply_carries_usage_and_finish_reason(server):
    answer = chat(server, "hello", temperature=0.0, max_tokens=5)
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert answer["choices"][0]["finish_reason"] == "length"
    usage = answer["usage"]
    assert usage["completion_tokens"] == 5 and usage["prompt_tokens"] > 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


# -------------------------------------------------------------------------------------- decoding


def test_max_tokens_is_respected(server):
    for n in (1, 3, 9):
        answer = chat(server, "count", temperature=0.7, seed=n, max_tokens=n)
        assert answer["usage"]["completion_tokens"] == n
        assert answer["choices"][0]["finish_reason"] == "length"
    newer = chat(server, "count", temperature=None, max_tokens=None, max_completion_tokens=2)  # OpenAI's newer name
    assert newer["usage"]["completion_tokens"] == 2


def test_a_stop_string_ends_the_reply_before_it(server):
    full = text_of(chat(server, "stop test", temperature=0.0, max_tokens=16))
    # Cut at an ASCII character, whose bytes are one token whichever tokens surround it.
    cut = next(i for i, c in enumerate(full) if i >= 2 and c.isascii() and c.isprintable() and c not in full[:i])
    answer = chat(server, "stop test", temperature=0.0, max_tokens=16, stop=[full[cut]])
    assert text_of(answer) == full[:cut]
    assert answer["choices"][0]["finish_reason"] == "stop"


def test_a_seeded_request_gives_the_same_text_alone_and_inside_a_mixed_batch(server):
    request = {"temperature": 0.9, "top_p": 0.95, "seed": 1234, "max_tokens": 12}
    alone = chat(server, "write a faster softmax", **request)
    others = [("a much longer prompt about layernorm kernels " * 3, {"temperature": 1.0, "seed": 1, "max_tokens": 20}),
              ("x", {"temperature": 0.0, "max_tokens": 4}),
              ("write a faster softmax", {"temperature": 0.9, "top_p": 0.95, "seed": 99, "max_tokens": 12}),
              ("rmsnorm", {"temperature": 0.5, "seed": 7, "max_tokens": 8}),
              ("write a faster softmax", request)]
    for _ in range(3):  # the threads start at once; on a loaded host the last may still come after the batch left
        start = threading.Barrier(len(others))

        def send(cf):
            start.wait()
            return chat(server, cf[0], **cf[1])

        with ThreadPoolExecutor(len(others)) as pool:
            batched = list(pool.map(send, others))
        if batched[-1]["engine"]["batch_size"] > 1:
            break
    assert batched[-1]["engine"]["batch_size"] > 1, "the request was not batched with the others in three tries"
    assert text_of(batched[-1]) == text_of(alone)
    assert text_of(batched[2]) != text_of(alone), "another seed should draw another text"


def test_concurrent_requests_are_generated_in_fewer_batches_than_requests(server):
    before = get(f"{server.root_url}/stats")[1]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: chat(server, f"kernel {i}", temperature=0.8, seed=i, max_tokens=6), range(8)))
    after = get(f"{server.root_url}/stats")[1]
    assert after["requests"] - before["requests"] == 8
    assert after["batches"] - before["batches"] < 8
    assert max(a["engine"]["batch_size"] for a in answers) > 1


# ---------------------------------------------------------------------------------- bad requests


def _refused(server, body) -> str:
    status, answer = post(f"{server.base_url}/chat/completions", body)
    assert status == 400, answer
    return answer["error"]["message"]


def test_a_request_without_messages_is_refused_by_name(server):
    assert "'messages'" in _refused(server, {"model": "tiny", "max_tokens": 4})
    assert "'messages'" in _refused(server, {"model": "tiny", "messages": [], "max_tokens": 4})


def test_a_prompt_too_long_for_the_context_is_refused_with_its_token_count(server):
    message = _refused(server, {"messages": [{"role": "user", "content": "y" * 2 * CONTEXT}], "max_tokens": 4})
    assert "the prompt is" in message and "tokens" in message and str(CONTEXT) in message
    count = int(message.split("the prompt is ")[1].split()[0])
    assert count > CONTEXT


def test_a_prompt_plus_max_tokens_beyond_the_context_is_refused(server):
    message = _refused(server, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": CONTEXT})
    assert "max_tokens" in message and str(CONTEXT) in message


@pytest.mark.parametrize("field, value, named", [
    ("max_tokens", 0, "'max_tokens'"),
    ("temperature", -1, "'temperature'"),
    ("top_p", 0, "'top_p'"),
    ("seed", "abc", "'seed'"),
    ("n", 2, "'n'"),
    ("stream", True, "'stream'"),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}, "'response_format'"),
])
def test_an_unusable_field_is_refused_by_name(server, field, value, named):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, field: value}
    assert named in _refused(server, body)


def test_a_body_that_is_not_json_is_refused(server):
    status, answer = post(f"{server.base_url}/chat/completions", b"{not json")
    assert status == 400 and "not JSON" in answer["error"]["message"]


def _generate_all(engine, jobs) -> None:
    """Submit ``jobs`` at once, as concurrent clients do, and wait for every one."""
    with ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(engine.submit, jobs))


def test_a_prefill_in_row_chunks_gives_the_same_tokens_as_one_prefill(tiny_model):
    from kernelcast.infra.engine import Engine, load

    tokenizer, model = load(tiny_model, device="cpu")
    replies = []
    for prefill_tokens in (16384, 40):  # 40: one or two rows per prefill forward
        engine = Engine(model, tokenizer, name="tiny", prefill_tokens=prefill_tokens)
        try:
            jobs = [engine.job({"messages": [{"role": "user", "content": "kernel " * k}], "max_tokens": 10,
                                "temperature": 0.8 * (k % 2), "seed": k}) for k in (1, 2, 5, 9, 3)]
            _generate_all(engine, jobs)
        finally:
            engine.close()
        replies.append([job.token_ids for job in jobs])
    assert replies[0] == replies[1]
    assert len({len(j.prompt_ids) for j in jobs}) == len(jobs) and max(len(j.prompt_ids) for j in jobs) > 20


def test_greedy_decoding_over_the_slots_matches_transformers_own_generate(tiny_model):
    """The slot cache and its attention (per-row lengths, grouped heads read in place) compute what the
    model's own attention computes: greedy tokens equal ``model.generate``'s, one prompt at a time."""
    from transformers import AutoModelForCausalLM

    from kernelcast.infra.engine import Engine, load

    tokenizer, model = load(tiny_model, device="cpu")
    reference = AutoModelForCausalLM.from_pretrained(str(tiny_model.parent), gguf_file=tiny_model.name,
                                                     torch_dtype=torch.float32, attn_implementation="eager")
    assert model.config.num_key_value_heads < model.config.num_attention_heads, "the tiny model must use GQA"
    engine = Engine(model, tokenizer, name="tiny", max_batch=3)
    try:
        jobs = [engine.job({"messages": [{"role": "user", "content": text}], "max_tokens": 12, "temperature": 0})
                for text in ("softmax", "a longer prompt about layernorm " * 3, "x", "rms " * 7)]
        _generate_all(engine, jobs)
    finally:
        engine.close()
    for job in jobs:
        out = reference.generate(torch.tensor([job.prompt_ids]), max_new_tokens=12, do_sample=False,
                                 eos_token_id=sorted(engine.end_ids), pad_token_id=engine.pad_id)
        expected = [t for t in out[0, len(job.prompt_ids):].tolist() if t not in engine.end_ids]
        assert job.token_ids == expected[: len(job.token_ids)] and len(job.token_ids) == len(expected)


def test_a_freed_slot_takes_the_next_request_while_the_others_still_decode(tiny_model):
    """Continuous batching: with two slots, short requests queued behind a long one are admitted as slots
    free up and answered before the long one ends; a seeded text is the same as when it runs alone."""
    from kernelcast.infra.engine import Engine, load

    tokenizer, model = load(tiny_model, device="cpu")

    def request(content, max_tokens, seed):
        return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                "temperature": 0.9, "seed": seed}

    engine = Engine(model, tokenizer, name="tiny", max_batch=2)
    try:
        alone = engine.submit(engine.job(request("short 3", 4, 3)))
        long = engine.job(request("long", 200, 1))
        short = [engine.job(request(f"short {k}", 4, k)) for k in range(2, 6)]
        ends = {}

        def submit(job):
            engine.submit(job, 120)
            ends[id(job)] = time.monotonic()

        with ThreadPoolExecutor(5) as pool:
            futures = [pool.submit(submit, long)]
            deadline = time.monotonic() + 60
            while not long.token_ids and time.monotonic() < deadline:  # the long one is decoding
                time.sleep(0.001)
            futures += [pool.submit(submit, job) for job in short]
            for f in futures:
                f.result()
        # the last request is handed back before the worker, done with its step, gives the cache back
        deadline = time.monotonic() + 10
        while (stats := engine.snapshot())["slots"] and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        engine.close()
    assert all(ends[id(job)] < ends[id(long)] for job in short), "short requests waited for the long one"
    assert short[1].token_ids == alone.token_ids
    assert len(long.token_ids) == 200 and long.finish_reason == "length"
    assert stats["batches"] >= 3, "each freed slot should admit queued requests in later admissions"
    assert stats["slots"] == 0, "an idle engine gives its slot cache back"


def test_a_request_needing_longer_slots_waits_for_the_next_cache_and_is_served(tiny_model):
    from kernelcast.infra.engine import Engine, load

    tokenizer, model = load(tiny_model, device="cpu")
    # 400 tokens for 4 slots: a share of 100, so the small requests get 3 slots of 128 tokens and the big
    # one (its prompt and 300 new tokens) fits none of them; it gets a cache of its own once they are done.
    engine = Engine(model, tokenizer, name="tiny", max_batch=4, max_batch_tokens=400)
    try:
        small = [engine.job({"messages": [{"role": "user", "content": "a"}], "max_tokens": 100, "seed": k})
                 for k in range(3)]
        big = engine.job({"messages": [{"role": "user", "content": "b"}], "max_tokens": 300, "seed": 9})
        sizes = []
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(engine.submit, job, 120) for job in small]
            deadline = time.monotonic() + 30  # admitted when the engine's loop next runs: on a loaded CPU, later
            while engine.snapshot()["slots"] == 0 and time.monotonic() < deadline:
                time.sleep(0.005)
            snapshot = engine.snapshot()
            sizes.append((snapshot["slots"], snapshot["slot_tokens"]))
            futures.append(pool.submit(engine.submit, big, 120))
            results = [f.result() for f in futures]
    finally:
        engine.close()
    assert all(job.error is None and job.finish_reason in ("stop", "length") for job in results)
    assert big.finish_reason == "stop" or len(big.token_ids) == 300
    assert sizes == [(3, 128)] and big.batch_id > max(job.batch_id for job in small)


# ------------------------------------------------------------------------------------ templates


def test_the_chat_template_comes_from_the_gguf_and_qwen2_without_one_falls_back_to_chatml(tiny_model, tmp_path):
    from transformers import AutoTokenizer, Qwen2Config

    from kernelcast.infra.engine import CHATML, chat_template

    with_template = AutoTokenizer.from_pretrained(str(tiny_model.parent), gguf_file=tiny_model.name)
    assert chat_template(with_template, Qwen2Config()) == TEMPLATE
    write_tiny_qwen2_gguf(tmp_path / "bare.gguf", chat_template=None)
    bare = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="bare.gguf")
    assert chat_template(bare, Qwen2Config()) == CHATML
    with pytest.raises(ValueError, match="no chat template"):
        chat_template(bare, type("Config", (), {"model_type": "llama"})())


# ------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_on_a_gpu_a_greedy_reply_is_the_same_alone_and_beside_longer_and_shorter_prompts(tiny_model):
    """Slots on CUDA: a row's logits do not depend on the other slots' lengths (float32 keeps ties apart)."""
    gpu = EngineServer(tiny_model, "--device", "cuda", "--dtype", "float32", "--gather-ms", "300").wait_ready()
    try:
        assert get(f"{gpu.root_url}/stats")[1]["device"].startswith("cuda")
        alone = chat(gpu, "write a faster softmax", temperature=0.0, max_tokens=16)
        prompts = ["write a faster softmax", "a much longer prompt about layernorm kernels " * 4, "x"]
        with ThreadPoolExecutor(len(prompts)) as pool:
            batched = list(pool.map(lambda p: chat(gpu, p, temperature=0.0, max_tokens=16), prompts))
    finally:
        gpu.stop()
    assert batched[0]["engine"]["batch_size"] > 1
    assert text_of(batched[0]) == text_of(alone)


def test_with_a_shared_gpu_lock_the_engine_generates_only_while_it_holds_it(tiny_model, tmp_path):
    """The engine takes the harness's GPU lock for each step: while a kernel is timed (another process holds
    it) no token is generated, and generation goes on once the lock is released."""
    import fcntl

    from kernelcast.infra.engine import Engine, load

    tokenizer, model = load(tiny_model, device="cpu")
    lock = tmp_path / "gpu.lock"
    holder = open(lock, "a")
    fcntl.flock(holder, fcntl.LOCK_EX)
    engine = Engine(model, tokenizer, name="tiny", gpu_lock=str(lock))
    try:
        job = engine.job({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0})
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(engine.submit, job, 60)
            time.sleep(1.5)
            assert not job.done.is_set() and job.token_ids == [], "the engine generated while the lock was held"
            fcntl.flock(holder, fcntl.LOCK_UN)
            assert answer.result().error is None and job.token_ids
    finally:
        holder.close()
        engine.close()
