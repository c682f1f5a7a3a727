"""Spike (issue 13): split a model across two `skippyctl stage serve` workers over ggml RPC.

    PYTHONPATH=. .venv/bin/python -m benchmarks.rpc_stages_spike [--model fixtures/tiny.gguf]

Starts two stages on loopback (`skippyctl stage serve --json --port 0 --threads 1`), then, each
in a throwaway child process (llama.cpp aborts the process that holds a model when a stage
goes away, so the orchestrator never loads one itself):

1. `reference`: greedy tokens from a plain CPU load;
2. `split`: `ggml_backend_rpc_add_server` per stage, the registries' devices, every stage's
   free/total memory (`ggml_backend_rpc_get_device_memory` and `ggml_backend_dev_memory` on the
   registered device), then the model loaded with `llama_model_params.devices` = the two RPC
   devices (NULL-terminated), all layers offloaded, `tensor_split` 1:1, and the same greedy
   decode;
3. `split` again with half the layers offloaded (the rest stays on the CPU);
4. `decode-forever` on the split model, while the orchestrator kills stage 2 mid-decode: how the
   child ends.

Prints one JSON report on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Final

import orjson

ROOT: Final = Path(__file__).resolve().parents[1]
PROMPT: Final = "The quick brown fox jumps over the lazy dog"
TOKENS: Final = 24
THREADS: Final = 1


def _log(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


# -- child side ------------------------------------------------------------------------------------


def _greedy(llama: Any, model: Any, n_tokens: int, forever: bool = False) -> list[int]:
    params = llama.llama_context_default_params()
    params.n_ctx = 256
    params.n_batch = 256
    params.n_seq_max = 1
    params.n_threads = params.n_threads_batch = THREADS
    context = llama.llama_init_from_model(model, params)
    if not context:
        raise SystemExit("cannot create a context")
    vocab = llama.llama_model_get_vocab(model)
    chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
    llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
    data = PROMPT.encode()
    prompt = (llama.llama_token * (len(data) + 2))()
    n_prompt = int(llama.llama_tokenize(vocab, data, len(data), prompt, len(data) + 2, True, True))
    if llama.llama_decode(context, llama.llama_batch_get_one(prompt, n_prompt)) != 0:
        raise SystemExit("decode failed on the prompt")
    memory = llama.llama_get_memory(context)
    one = (llama.llama_token * 1)()
    tokens: list[int] = []
    position = n_prompt
    while forever or len(tokens) < n_tokens:
        one[0] = llama.llama_sampler_sample(chain, context, -1)
        tokens.append(int(one[0]))
        if forever and len(tokens) == 8:
            sys.stdout.write("decoding\n")
            sys.stdout.flush()
        position += 1
        if position >= 250:  # keep decoding forever inside a small context
            llama.llama_memory_clear(memory, True)
            position = 0
        if llama.llama_decode(context, llama.llama_batch_get_one(one, 1)) != 0:
            raise SystemExit("decode failed")
    llama.llama_sampler_free(chain)
    llama.llama_free(context)
    return tokens


def _child(mode: str, model_path: str, endpoints: list[str], gpu_layers: int) -> dict[str, Any]:
    import llama_cpp as llama

    from skippyctl.native.rpc import GgmlRpc

    llama.llama_backend_init()
    params = llama.llama_model_default_params()
    report: dict[str, Any] = {"mode": mode}
    keep: list[Any] = []
    if mode != "reference":
        rpc = GgmlRpc()
        devices: list[int] = []
        stages = []
        for endpoint in endpoints:
            registry = rpc.add_server(endpoint)
            if registry is None:
                raise SystemExit(f"{endpoint}: no device")
            found = rpc.registry_devices(registry)
            devices += found
            direct = rpc.get_device_memory(endpoint, 0)
            via_device = rpc.device_memory(found[0])
            stages.append(
                {
                    "devices": [rpc.device_name(d) for d in found],
                    "rpc_get_device_memory": [direct.free_bytes, direct.total_bytes],
                    "dev_memory_on_registered_device": [
                        via_device.free_bytes,
                        via_device.total_bytes,
                    ],
                }
            )
        report["stages"] = stages
        array = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
        keep.append(array)
        params.devices = ctypes.cast(array, ctypes.c_void_p)
        split = (ctypes.c_float * int(llama.llama_max_devices()))()
        for index in range(len(devices)):
            split[index] = 1.0
        keep.append(split)
        params.tensor_split = split
        params.n_gpu_layers = gpu_layers
        params.split_mode = llama.LLAMA_SPLIT_MODE_LAYER
    model = llama.llama_model_load_from_file(model_path.encode(), params)
    if not model:
        raise SystemExit("the model did not load")
    report["n_layer"] = int(llama.llama_model_n_layer(model))
    forever = mode == "decode-forever"
    report["tokens"] = _greedy(llama, model, TOKENS, forever=forever)
    if mode != "reference":
        rpc = GgmlRpc()
        report["memory_after_load"] = [
            [m.free_bytes, m.total_bytes] for m in (rpc.get_device_memory(e) for e in endpoints)
        ]
    llama.llama_model_free(model)
    return report


# -- orchestrator ----------------------------------------------------------------------------------


class Stage:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "skippyctl",
                "stage",
                "serve",
                "--json",
                "--port",
                "0",
                "--threads",
                str(THREADS),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
        )
        self.records: list[dict[str, Any]] = []
        stdout: IO[bytes] | None = self.process.stdout
        assert stdout is not None
        self._stdout = stdout
        while True:
            line = stdout.readline()
            if not line:
                raise SystemExit("a stage exited before it was ready")
            record = orjson.loads(line)
            self.records.append(record)
            if record["event"] == "stage_ready":
                self.endpoint = f"127.0.0.1:{record['summaries']['port']}"
                self.worker_pid = _worker_of(self.process.pid)
                return
            if record["event"] == "stage_failed":
                raise SystemExit(f"stage failed: {record}")

    def stop(self) -> dict[str, Any]:
        try:  # a stage whose worker died ends by itself (stage_failed, exit 21)
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGTERM)
        rest = self._stdout.read()
        code = self.process.wait(30)
        self.records += [orjson.loads(line) for line in rest.splitlines() if line]
        return {"exit": code, "events": [r["event"] for r in self.records]}


def _worker_of(pid: int) -> int:
    """The stage worker process `stage serve` started (its only child)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(children[0])


def _run_child(args: list[str], timeout: float = 300) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.rpc_stages_spike", "--child", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=dict(os.environ, GGML_NO_BACKTRACE="1"),
    )
    return proc.returncode, proc.stdout, proc.stderr


def _interesting(stderr: str) -> list[str]:
    keys = ("RPC", "offload", "buffer size", "abort", "Remote", "error", "failed", "CPU_Mapped")
    return [line for line in stderr.splitlines() if any(k in line for k in keys)][:30]


def _orchestrate(model: str) -> dict[str, Any]:
    report: dict[str, Any] = {"model": Path(model).name}
    stages = [Stage(), Stage()]
    endpoints = [s.endpoint for s in stages]
    _log(f"stages ready at {endpoints}")
    try:
        code, out, err = _run_child(["reference", model, "0"])
        if code != 0:
            raise SystemExit(f"reference failed ({code}): {err[-2000:]}")
        reference = orjson.loads(out.splitlines()[-1])
        report["reference"] = reference
        n_layer = int(reference["n_layer"])
        for name, layers in (("split_all_layers", 999), ("split_half_layers", n_layer // 2)):
            code, out, err = _run_child(["split", model, str(layers), *endpoints])
            entry: dict[str, Any] = {"exit": code, "log": _interesting(err)}
            if code == 0:
                result = orjson.loads(out.splitlines()[-1])
                entry.update(result)
                entry["same_tokens_as_cpu"] = result["tokens"] == reference["tokens"]
            report[name] = entry
            _log(f"{name}: exit {code}, same tokens: {entry.get('same_tokens_as_cpu')}")
        # A stage killed mid-decode: the process holding the model.
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.rpc_stages_spike",
                "--child",
                "decode-forever",
                model,
                "999",
                *endpoints,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=dict(os.environ, GGML_NO_BACKTRACE="1"),
        )
        assert child.stdout is not None
        assert child.stderr is not None
        line = child.stdout.readline()
        killed = stages[1].worker_pid
        os.kill(killed, signal.SIGKILL)
        started = time.monotonic()
        try:
            code = child.wait(60)
        except subprocess.TimeoutExpired:
            child.kill()
            code = child.wait()
        err_text = child.stderr.read().decode(errors="replace")
        report["stage_killed_mid_decode"] = {
            "child_was_decoding": line.strip() == b"decoding",
            "child_exit": code,
            "child_signal": signal.Signals(-code).name if code < 0 else None,
            "seconds_to_exit": round(time.monotonic() - started, 3),
            "stderr_tail": err_text.strip().splitlines()[-5:],
        }
        _log(f"killed stage 2 mid-decode: child exit {code}")
    finally:
        report["stage_supervisors"] = [s.stop() for s in reversed(stages)][::-1]
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=str(ROOT / "fixtures" / "tiny.gguf"))
    parser.add_argument("--child", nargs="+", default=None)
    args = parser.parse_args()
    if args.child:
        mode, model, layers, *endpoints = args.child
        result = _child(mode, model, endpoints, int(layers))
        sys.stdout.write(orjson.dumps(result).decode() + "\n")
        return
    sys.stdout.write(orjson.dumps(_orchestrate(args.model), option=orjson.OPT_INDENT_2).decode())
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
