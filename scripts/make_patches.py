#!/usr/bin/env python3
"""Regenerate patches/ (the numbered series applied to the pinned llama-cpp-python sdist) from a git tree.

Workflow for whoever changes the patched llama.cpp:

    # 1. a git working tree: the pristine sdist as the first commit, then one commit per current patch
    python scripts/make_patches.py init /tmp/llama-dev
    # 2. edit files under /tmp/llama-dev; amend the commit of the concern you change (git rebase -i, or
    #    `git commit --fixup <sha>` + `git rebase -i --autosquash`), or add a new commit for a new concern.
    #    The commit message is the patch header: first line = subject, body = what and why.
    #    Stage with `git add -A` (not -f, which would also add the excluded csrc copies; export drops
    #    those paths anyway).
    # 3. write patches/NNNN-<subject>.patch, one per commit after the pristine one (old ones are removed)
    python scripts/make_patches.py export /tmp/llama-dev

The csrc/ files (copied into vendor/llama.cpp/ggml/src/ggml-bitcos/ and ggml/include/ at build time by
ggml_bitcos.build) are never part of a patch: `init` copies them in and adds them to .git/info/exclude, and
`export` excludes those paths. Edit them in csrc/ of this repository, not in the dev tree.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ggml_bitcos import build, upstream  # noqa: E402

PATCH_DIR = REPO / "patches"


def git(tree: Path, *args: str, capture: bool = False) -> str:
    r = subprocess.run(
        ["git", "-C", str(tree), *args], check=True, text=True, stdout=subprocess.PIPE if capture else None
    )
    return r.stdout if capture else ""


def init(tree: Path) -> None:
    """Create `tree`: pristine sdist commit + one commit per patch in patches/ (message = patch header)."""
    src = upstream.extract_sdist(tree.parent / (tree.name + ".extract"))
    shutil.move(str(src), str(tree))
    shutil.rmtree(tree.parent / (tree.name + ".extract"))
    # the sdist ships the upstream .git directories; the dev tree gets its own history
    for dotgit in sorted(tree.rglob(".git"), key=lambda p: len(p.parts), reverse=True):
        shutil.rmtree(dotgit) if dotgit.is_dir() else dotgit.unlink()
    git(tree, "init", "-q")
    git(tree, "config", "user.name", "ggml-bitcos")
    git(tree, "config", "user.email", "ggml-bitcos@localhost")
    git(tree, "add", "-A", "-f")  # -f: the sdist holds files its .gitignore lists
    git(tree, "commit", "-q", "-m", f"pristine llama-cpp-python {upstream.SDIST_VERSION} sdist")
    exclude = tree / ".git" / "info" / "exclude"
    with open(exclude, "a") as f:
        for rel in build.csrc_destinations():
            f.write(f"/{rel}\n")
    build.copy_csrc(tree)
    for patch in sorted(PATCH_DIR.glob("*.patch")):
        # `git am` keeps the header (subject + body) as the commit message
        git(tree, "am", "-q", "--keep-cr", str(patch))
    print(f"dev tree ready: {tree} ({len(list(PATCH_DIR.glob('*.patch')))} patches applied)")


def export(tree: Path, out_dir: Path = PATCH_DIR) -> None:
    """Write one patch per commit after the pristine one into out_dir (patches/), replacing the old series."""
    root = git(tree, "rev-list", "--max-parents=0", "HEAD", capture=True).split()[0]
    excludes = [f":(exclude){rel}" for rel in build.csrc_destinations()]
    commits = git(tree, "rev-list", "--reverse", f"{root}..HEAD", capture=True).split()
    for old in out_dir.glob("*.patch"):
        old.unlink()
    out_dir.mkdir(exist_ok=True)
    for n, sha in enumerate(commits, start=1):
        subject = git(tree, "log", "-1", "--format=%s", sha, capture=True).strip()
        slug = re.sub(r"[^a-z0-9]+", "-", subject.lower()).strip("-")
        if len(slug) > 50:  # cut at a word boundary
            slug = slug[:50].rsplit("-", 1)[0]
        text = git(
            tree,
            "format-patch",
            "-1",
            "--stdout",
            "--no-signature",
            "--zero-commit",
            "--no-stat",
            "-N",
            sha,
            "--",
            ".",
            *excludes,
            capture=True,
        )
        out = out_dir / f"{n:04d}-{slug}.patch"
        out.write_text(text)
        print(f"{out}: {subject}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("init", help="create a git dev tree from the sdist + current patches")
    p.add_argument("tree", type=Path)
    p = sub.add_parser("export", help="regenerate patches/ from the dev tree's commits")
    p.add_argument("tree", type=Path)
    p.add_argument("--out", type=Path, default=PATCH_DIR, help="folder to write the series to (default patches/)")
    args = ap.parse_args()
    if args.cmd == "init":
        init(args.tree.resolve())
    else:
        export(args.tree.resolve(), args.out.resolve())


if __name__ == "__main__":
    main()
