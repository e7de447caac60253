"""`python -m localcloud -- COMMAND...`: run COMMAND with the local cloud up and its variables set."""

from __future__ import annotations

import signal
import subprocess
import sys

from localcloud import LocalCloud


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(f"usage: {__doc__}")
        return 0
    command = argv[argv.index("--") + 1:] if "--" in argv else argv
    if not command:
        print(f"usage: {__doc__}")
        return 2
    with LocalCloud() as cloud:
        print(f"local cloud: Cloud Storage {cloud.emulator.host}, Vertex AI {cloud.fake.endpoint}, "
              f"trainer image {cloud.image_uri}", flush=True)
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            return subprocess.run(command).returncode
        finally:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
