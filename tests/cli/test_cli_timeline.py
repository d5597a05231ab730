"""``zepp timeline``: the drawn batch is the benchmark table's (the same latency as ``zepp
bench``'s configuration, third batch), the PNG draws the ranks asked for, and one clear line
per bad option before any work (the bad-input table: ``tests/cli/test_cli_bad_inputs.py``)."""


from clirun import run_cli
from zepp.sim.bench_jobs import make_config, make_jobs
from zepp.sim.run import run_system

ARGS = ["timeline", "--nodes", "2", "--model", "qwen", "--budget-mb", "0.5"]


def test_timeline_draws_the_tables_third_batch(tmp_path, capsys):
    png = tmp_path / "t.png"
    code, out, err = run_cli([*ARGS, "--system", "a2av", "--ranks", "0,5", "--out", str(png)], capsys)
    assert code == 0, err
    job = make_jobs(["a100"], [2], 4, ["qwen"], [0.5], ["a2av"], iters=1, warmup=2, seed=0, traces=None)[0]
    want = run_system("a2av", make_config(job)).latencies[0]
    assert f"a2av: {want * 1e3:.3f} ms" in out and f"wrote {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

