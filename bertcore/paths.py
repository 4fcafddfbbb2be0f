"""Local paths that must stay where they belong: inside a stage directory, or inside an
input folder. Symbolic links are resolved before a path is trusted, deletion never
follows one, and only regular files are ever opened (a FIFO would block the reader
forever, a device has no end).

pipelines/storage.py applies these rules to every local read, hash, write and delete under
run.root, and to every folder walk of the inputs; bertcore/train/checkpoint.py to the pretrain
stage's local checkpoint folder.
"""

from __future__ import annotations

import os
import shutil
import stat

from bertcore.errors import BertpipeError


class PathEscape(BertpipeError):
    """A path would leave the folder it belongs to (by its text, or through a symbolic link)."""


def is_within(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or below it (both taken as they are, no links resolved)."""
    path, folder = os.path.normpath(path), os.path.normpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def inside(path: str, folder: str) -> str:
    """`path`, if where it really is (symbolic links followed) lies inside where `folder`
    really is; PathEscape otherwise."""
    real = os.path.realpath(path)
    if not is_within(real, os.path.realpath(folder)):
        raise PathEscape(
            f"{path} leads to {real}, outside {folder} (through a symbolic link); remove the link and run again"
        )
    return path


def first_link(path: str, folder: str) -> str | None:
    """The first symbolic link on the way from `folder` (not included) down to `path`
    (included), or None. `path` must be below `folder` by its text."""
    relative = os.path.relpath(path, folder)
    if relative == os.curdir:
        return None
    if relative.startswith(os.pardir):
        raise PathEscape(f"{path} is not inside {folder}")
    current = folder
    for part in relative.split(os.sep):
        current = os.path.join(current, part)
        if os.path.islink(current):
            return current
        if not os.path.lexists(current):
            return None
    return None


def remove_within(path: str, folder: str, recursive: bool = False) -> None:
    """Delete `path`, below `folder`, without following a symbolic link: when the path or a
    folder on the way to it is a link, the link itself is removed, never what it points to.
    Folders are removed with everything in them when `recursive` (links inside are unlinked)."""
    link = first_link(path, folder)
    if link is not None:
        os.unlink(link)
    elif os.path.isdir(path):
        if recursive:
            shutil.rmtree(path)
        else:
            os.rmdir(path)
    elif os.path.lexists(path):
        os.unlink(path)


_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a folder"),
)


def not_regular(path: str) -> str | None:
    """Why `path` (links followed) cannot be read as a file, or None for a regular file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a broken symbolic link" if os.path.islink(path) else "not found"
    except OSError as exc:  # ELOOP: a link that leads to itself
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return f"{kind}, not a regular file"


def walk_files(folder: str) -> tuple[list[str], list[tuple[str, str]]]:
    """Every regular file under `folder`, sorted, and the entries left out with the reason:
    a symbolic link leading out of the folder, or to a folder (never followed, so a walk
    never loops), a broken link, a FIFO, a socket, a device. A link to a regular file
    inside the folder is kept. Nothing is opened."""
    files, _, skipped = walk(folder)
    return files, skipped


def walk(folder: str) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """`walk_files`, with the folders below `folder` too: (files, folders, skipped)."""
    real_folder = os.path.realpath(folder)
    files: list[str] = []
    folders: list[str] = []
    skipped: list[tuple[str, str]] = []
    pending = [folder]
    while pending:
        current = pending.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError as exc:
            skipped.append((current, f"cannot be listed ({exc.strerror})"))
            continue
        for entry in entries:
            if entry.is_symlink():
                target = os.path.realpath(entry.path)
                if not is_within(target, real_folder):
                    skipped.append(
                        (entry.path, f"a symbolic link to {target}, outside the input folder (not followed)")
                    )
                elif os.path.isdir(target):
                    skipped.append((entry.path, "a symbolic link to a folder (not followed)"))
                elif problem := not_regular(entry.path):
                    skipped.append((entry.path, problem))
                else:
                    files.append(entry.path)
            elif entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
                folders.append(entry.path)
            elif entry.is_file(follow_symlinks=False):
                files.append(entry.path)
            else:
                skipped.append((entry.path, not_regular(entry.path) or "not a regular file"))
    return sorted(files), sorted(folders), sorted(skipped)
