"""What the fleet parts cost and give: one workload tuned with each combination of builder and runner.

Every variant is `tunecore run --search random` as its own process, one after the other, on the same workload,
trials and seed (so they measure the same programs), timed from process start to exit:

  local          the local measurer (warm build pool, one runner process)
  dask           builds on a Dask LocalCluster (127.0.0.1), runs here
  rpc xN         builds here, runs on N TVM RPC servers (tunecore fleet server) on this machine
  dask+rpc xN    both

On one machine the servers share its cores, so this measures the fleet's overhead (sessions, uploads, Dask
tasks), not a speed-up; with boards elsewhere, runs happen in parallel. With one server, the best latency found
is compared with the local run's (one run each: a gross distortion would show, a small one would not); with two
servers on two cores, two candidates run at once on the same cores, as they would on any host that serves more
devices than it has cores for.

    python bench/fleet.py [--model op:matmul-512] [--trials 64] [--servers 1,2]

Writes bench/results/fleet.{json,md}.
"""

from __future__ import annotations

import sys

from tunecore import experiments
from tunecore.experiments import command_line, environment, run_tunecore, write_results
from tunecore.testing.fleet import Fleet


def main() -> None:
    parser = experiments.script_parser(__doc__, __file__)
    parser.add_argument("--model", default="op:matmul-512")
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--servers", default="1,2", help="server counts to run the rpc variants with")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    dask = ["-O", "measurer.builder=dask"]
    results = {}

    def variant(name: str, extra: list[str]) -> None:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        r = run_tunecore(args.model, args.trials, args.seed, search="random", cost_model="none", store="memory:",
                         extra_args=extra)
        r["candidates_per_min"] = r["measured"] / r["wall_s"] * 60
        results[name] = {k: r[k] for k in ("wall_s", "measured", "errors", "best_latency_s", "phase_s",
                                           "candidates_per_min")}
        print(f"  {r['measured']} measured ({r['errors']} failed) in {r['wall_s']:.1f} s", file=sys.stderr)

    variant("local", [])
    variant("dask", dask)
    for servers in (int(n) for n in args.servers.split(",")):
        fleet = Fleet(key=f"bench{servers}", servers=servers)
        try:
            variant(f"rpc x{servers}", fleet.cli_options())
            variant(f"dask+rpc x{servers}", dask + fleet.cli_options())
        finally:
            fleet.close()
    report = {"benchmark": "fleet", "model": args.model, "trials": args.trials, "servers": args.servers,
              "seed": args.seed, "environment": environment(), "results": results, "command": command_line("fleet.py")}
    write_results(args.out, "fleet", report, markdown(report))


def markdown(report: dict) -> str:
    local = report["results"]["local"]
    lines = [
        f"# Fleet parts: {report['model']}, {report['trials']} trials, RPC servers on this machine",
        "",
        experiments.environment_line(report),
        "",
        "| variant | wall s | measured (failed) | candidates/min | measure phase s | best ms | best vs local |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in report["results"].items():
        best = r["best_latency_s"]
        lines.append(
            f"| {name} | {r['wall_s']:.1f} | {r['measured']} ({r['errors']}) | {r['candidates_per_min']:.0f} | "
            f"{(r['phase_s'] or {}).get('measure', 0):.1f} | {best * 1e3:.3f} | {best / local['best_latency_s']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
