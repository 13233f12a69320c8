"""``python -m jaxmarket.train --distributed``: two local CPU processes (gloo collectives)
train one scenario together and write what one process with two devices writes, bit for
bit (the same partitioned program: each process holds one device's markets); only process
0 writes files; processes that disagree on the config stop before compiling."""

import os
import socket
import subprocess
import sys

import yaml
from conftest import ROOT

CONFIG = {
    "market": {
        "num_products": 2,
        "consumers": [{"name": "consumers", "count": 3, "budget": [1.0, 1.6], "queries": 10.0}],
        "sellers": [{"name": "sellers", "count": 3, "action": "price", "low": 0.0, "high": 3.0,
                     "cost": 0.1, "reward": [{"kind": "profit"}]}],
        "distributor": {"kind": "logit", "temperature": 0.5, "outside_option": True},
    },
    "learners": {"sellers": {"kind": "ppo_bandit", "buffer_length": 4, "update_epochs": 2}},
    "train": {"num_iterations": 12, "rollout_length": 2, "num_envs": 4, "num_seeds": 2,
              "chunk_size": 12},
    "seed": 1,
}


REFUSAL = ("config error: --distributed: got 'process(es) [1] differ from process 0'; "
           "allowed: the same config on every process (scenario file, overrides, --devices, "
           "--resume)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(*args, devices: int = 1) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAXMARKET_COMPILE_CACHE": "none",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    return subprocess.Popen([sys.executable, "-m", "jaxmarket.train", *map(str, args)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    outputs = [p.communicate(timeout=240) for p in procs]
    return [(p.returncode, *o) for p, o in zip(procs, outputs)]


def pair(config, run_dir, overrides=((), ())):
    port = free_port()
    return [train(config, "--run-dir", run_dir, *extra, "--distributed",
                  "--coordinator-address", f"127.0.0.1:{port}", "--num-processes", 2,
                  "--process-id", i) for i, extra in enumerate(overrides)]


def test_two_processes_write_what_one_process_with_two_devices_writes(tmp_path):
    """(Processes that disagree on the config run alongside: five processes at once keep
    the two cores busy while the others start up.)"""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    multi, single, refused = (tmp_path / "two_processes", tmp_path / "one_process",
                              tmp_path / "refused")
    results = finish(pair(config, multi)
                     + [train(config, "--run-dir", single, "--devices", 2, devices=2)]
                     + pair(config, refused, overrides=((), ("seed=2",))))
    for code, out, err in results[:3]:
        assert code == 0, err[-3000:]
    (_, out0, _), (_, out1, _), (_, out, _) = results[:3]
    assert "markets sharded over 1 device(s) x 2 processes" in out0
    assert "run directory" not in out1 and "mean_price" not in out1   # process 0 reports
    assert "markets sharded over 2 device(s)" in out
    for name in ("summary.json", "metrics.csv", "seeds.csv", "config.yaml"):
        assert (multi / name).read_bytes() == (single / name).read_bytes(), name
    # one writer: one row per iteration (two appending processes would double them)
    assert len((multi / "metrics.csv").read_text().splitlines()) == 1 + 12
    assert sorted(p.name for p in (multi / "checkpoints").iterdir()) == ["12"]

    # processes that disagree on the config: one line each, exit 2, nothing written
    for code, out, err in results[3:]:
        lines = [x for x in err.splitlines() if x.startswith("config error")]
        assert code == 2, err[-3000:]
        assert lines == [REFUSAL]
    assert not refused.exists()


def test_incomplete_or_stray_address_flags_are_one_line_errors(tmp_path, capsys):
    from jaxmarket.cli import run_cli
    from jaxmarket.train.__main__ import main
    cases = [
        (["--distributed", "--num-processes", "2"],
         ("config error: --distributed: got '--coordinator-address, --process-id missing'; "
          "allowed: all three of")),
        (["--process-id", "1"],
         ("config error: --coordinator-address/--num-processes/--process-id: got '1'; "
          "allowed: only with --distributed")),
        (["--distributed", "--coordinator-address", "127.0.0.1:1", "--num-processes", "2",
          "--process-id", "2"],
         "config error: --process-id: got 2; allowed: an integer in [0, 1] (--num-processes 2)"),
        (["--distributed", "--coordinator-address", "nohost", "--num-processes", "2",
          "--process-id", "0"],
         "config error: --coordinator-address: got 'nohost'; allowed: HOST:PORT"),
    ]
    for args, start in cases:
        run_dir = tmp_path / "run"
        assert run_cli(main, [*args, "--run-dir", str(run_dir)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(start) and len(err.splitlines()) == 1, err
        assert not run_dir.exists()
