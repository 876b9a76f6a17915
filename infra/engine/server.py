"""The engine's HTTP server (the OpenAI routes) and its command line, ``python -m kernelcast.infra.engine``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from kernelcast.infra.engine.api import Job, RequestError
from kernelcast.infra.engine.batching import Engine
from kernelcast.infra.engine.loading import load

DESCRIPTION = "A batched generation engine behind an OpenAI-compatible chat endpoint, on torch and transformers alone."


def completion(engine: Engine, job: Job) -> dict:
    """The OpenAI chat completion object for a finished job."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": engine.name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": job.text},
                     "finish_reason": job.finish_reason}],
        "usage": {"prompt_tokens": len(job.prompt_ids), "completion_tokens": len(job.token_ids),
                  "total_tokens": len(job.prompt_ids) + len(job.token_ids)},
        "engine": {"batch": job.batch_id, "batch_size": job.batch_size},
    }


def make_server(engine: Engine, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """An HTTP server (one thread per connection) answering the OpenAI routes from ``engine``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a client's pooled connections are reused

        def log_message(self, *args):  # one line per request is noise at hundreds of requests a second
            pass

        def reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def error(self, status: int, message: str) -> None:
            kind = "invalid_request_error" if status < 500 else "server_error"
            self.reply(status, {"error": {"message": message, "type": kind, "code": status}})

        def do_GET(self):
            route = self.path.split("?")[0].rstrip("/")
            if route in ("/v1/models", "/models"):
                self.reply(200, {"object": "list", "data": [
                    {"id": engine.name, "object": "model", "owned_by": "kernelcast", "max_model_len": engine.context}]})
            elif route == "/health":
                self.reply(200, {"status": "ok"})
            elif route in ("/stats", "/v1/stats"):
                self.reply(200, engine.snapshot())
            else:
                self.error(404, f"no route GET {route}; known: /v1/models, /health, /stats")

        def do_POST(self):
            route = self.path.split("?")[0].rstrip("/")
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if route not in ("/v1/chat/completions", "/chat/completions"):
                return self.error(404, f"no route POST {route}; known: /v1/chat/completions")
            try:
                body = json.loads(raw or b"null")
            except ValueError as e:
                return self.error(400, f"the request body is not JSON: {e}")
            try:
                job = engine.submit(engine.job(body))
            except RequestError as e:
                return self.error(e.status, str(e))
            except Exception as e:  # noqa: BLE001 - a bug answers 500 with its name, never a dropped connection
                return self.error(500, f"{type(e).__name__}: {e}")
            if job.error:
                return self.error(500, job.error)
            self.reply(200, completion(engine, job))

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024  # hundreds of clients connect at once; the default backlog of 5 drops them

    return Server((host, port), Handler)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernelcast.infra.engine", description=DESCRIPTION)
    p.add_argument("--model", required=True, help="a .gguf file, or a transformers model folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="the model id /v1/models reports (default: file stem)")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cuda, cuda:N or cpu")
    p.add_argument("--dtype", default="auto",
                   help="auto (bfloat16 on a GPU, float32 on a CPU), bfloat16, float16, float32")
    p.add_argument("--max-batch", type=int, default=256, help="most requests generated together (default: %(default)s)")
    p.add_argument("--max-batch-tokens", type=int, default=None,
                   help="most padded prompt+new tokens a batch holds (default: half the free memory as KV cache)")
    p.add_argument("--prefill-tokens", type=int, default=16384, help="most tokens one prefill forward takes")
    p.add_argument("--max-context", type=int, default=None, help="cap on prompt+new tokens (default: the model's)")
    p.add_argument("--default-max-tokens", type=int, default=1024, help="max_tokens when a request names none")
    p.add_argument("--gather-ms", type=float, default=20.0, help="wait this long for more requests before a batch")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--chat-template", type=Path, default=None, help="a Jinja chat template file to use instead")
    p.add_argument("--gpu-lock", default=os.environ.get("KERNELCAST_GPU_LOCK") or None,
                   help="a lock file shared with kernelcast's measurement on this GPU (the harness's children take "
                        "it to time a kernel; the engine holds it for each step): generation and measurement can "
                        "then share one GPU without disturbing timings (default: $KERNELCAST_GPU_LOCK)")
    p.add_argument("--ignore-response-format", action="store_true",
                   help="answer requests that ask for a response_format unconstrained instead of refusing them")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    tokenizer, model = load(args.model, device=args.device, dtype=args.dtype)
    engine = Engine(model, tokenizer, name=args.served_model_name or Path(args.model).stem,
                    template=args.chat_template.read_text() if args.chat_template else None,
                    max_batch=args.max_batch, max_batch_tokens=args.max_batch_tokens,
                    prefill_tokens=args.prefill_tokens, context=args.max_context,
                    default_max_tokens=args.default_max_tokens, gather_s=args.gather_ms / 1000,
                    ignore_response_format=args.ignore_response_format, gpu_lock=args.gpu_lock)
    server = make_server(engine, args.host, args.port)
    print(f"serving {engine.name} on http://{args.host}:{server.server_address[1]}/v1 "
          f"({engine.device}, {next(model.parameters()).dtype}, loaded in {time.perf_counter() - start:.1f} s; "
          f"max batch {engine.max_batch} rows, {engine.max_batch_tokens} tokens)", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        engine.close()
    return 0

