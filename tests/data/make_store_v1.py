"""Regenerate tests/data/store-v1.db: a store written by the release before devices were recorded (schema 1).

    .venv/bin/python tests/data/make_store_v1.py [OUT] [--target JSON]     (OUT: tests/data/store-v1.db)

It extracts tunecore as it was at that release (commit a3c7f86, the parent of 3a2222d, which added schema 2 and
store-v1.db) from git history into a temporary directory and runs that release's command, with no plugin:

    tunecore run --model op:matmul-64 --trials 4 --store OUT --target '{"kind": "llvm", "mcpu": "znver3",
                 "num-cores": 2}'

then takes the file out of WAL mode and VACUUMs it. The file has that release's schema (meta schema 1, no devices
table, no device_id columns; `sqlite3 FILE .schema` prints the committed file's) and one finished run of 4 records
of op:matmul-64 on that target: the committed file's task id and program keys (seed 0), with this machine's
latencies and times and OUT as the run's store. It needs the git history and the .venv of this checkout (the
same TVM).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile

RELEASE = "a3c7f86f2e3d55e8dfe68fa7dd2f506f2a7f017a"  # schema 1: the last commit before device identity
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TARGET = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=os.path.join(HERE, "store-v1.db"))
    parser.add_argument("--target", default=json.dumps(TARGET), help="TVM JSON target (default: %(default)s)")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    for stale in (out, out + "-journal", out + "-wal", out + "-shm"):
        if os.path.exists(stale):
            os.remove(stale)
    with tempfile.TemporaryDirectory() as old:
        archive = subprocess.run(["git", "-C", ROOT, "archive", RELEASE, "tunecore"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
        # the old package first on the path; the installed plugins are left out (they are of this release)
        env = dict(os.environ, PYTHONPATH=old, TUNECORE_DISABLE_PLUGIN_AUTOLOAD="1")
        where = subprocess.run([sys.executable, "-c", "import tunecore; print(tunecore.__file__)"], env=env, cwd=old,
                               check=True, capture_output=True, text=True).stdout.strip()
        assert where.startswith(old), f"tunecore was imported from {where}, not from the extracted release"
        subprocess.run([sys.executable, "-m", "tunecore.cli", "run", "--model", "op:matmul-64", "--trials", "4",
                        "--store", out, "--target", args.target, "--json"], env=env, cwd=old, check=True,
                       stdout=subprocess.DEVNULL)
    # one self-contained file, as committed: out of WAL mode (no -wal/-shm files beside it), compacted (VACUUM
    # also writes the tables' definitions before the indexes')
    db = sqlite3.connect(out, isolation_level=None)
    db.execute("PRAGMA journal_mode=DELETE")
    db.execute("VACUUM")
    schema = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0]
    records = db.execute("SELECT COUNT(*) FROM records").fetchone()[0]
    db.close()
    assert schema == "1" and records == 4, (schema, records)
    print(f"{out}: schema {schema}, {records} records of op:matmul-64")


if __name__ == "__main__":
    main()
