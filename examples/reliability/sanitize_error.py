"""Make untrusted error text safe to store (docs/reliability.md, design §13).

Run::

    python examples/reliability/sanitize_error.py
"""

from __future__ import annotations

from wakuwaku.reliability import sanitize

# What a worker might send back: a URL with a password, terminal colours, a
# right-to-left override that reverses what a reader sees, a server path and
# bytes that are not UTF-8.
RAW = (
    b"connect failed: redis://worker:hunter2@10.0.0.7:6379/0\n"
    b"\x1b[31mTraceback\x1b[0m in /srv/app/worker.py: \xe2\x80\xaeexe.tnemyap \xff"
)


def main() -> None:
    print(sanitize(RAW))
    # Redaction happens before the cut, so no piece of the URL survives it.
    print(sanitize(RAW, limit=40))
    print(sanitize(ConnectionError("no route to host; config at C:\\deploy\\secrets.env")))


if __name__ == "__main__":
    main()
