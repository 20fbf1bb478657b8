"""Which files a source names: local paths, directories and globs walked under one symlink
policy, remote URLs listed through :mod:`tidal.storage`.

A directory or a glob is a *root*. Every way of listing treats symbolic links the same: a link
that resolves inside the root is read (each file once, under the first of its names), a link
out of it is refused unless ``follow_links``; link cycles end. Real paths are worked out once
per directory and per link, never per file, so a listing of a million files stays cheap.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterator, Sequence
from functools import partial

from tidal.errors import SourceError, StorageError
from tidal.formats import known_ending
from tidal.formats.ordered import listed_in_order
from tidal.sources.documents import without_documents
from tidal.sources.globs import glob_pattern
from tidal.sources.published import Sources, listed, location, read
from tidal.storage.config import Storage
from tidal.storage.fs import FileStat, Remote
from tidal.storage.urls import local_path, protocol


def listing(
    src: str | os.PathLike | Sequence[str | os.PathLike],
    storage: Storage | None = None,
    follow_links: bool = False,
    *,
    format: str | None = None,
    sources: Sources | None = None,
) -> dict[str, FileStat | None]:
    """The files a source names, in a stable order (each entry's files sorted, entries in the order
    given), with what a remote listing said of each (None when local).

    With ``sources``, a remote directory or glob is first looked up in the index published
    beside it (:mod:`tidal.sources.published`; what was found is kept in ``sources`` for the index):
    where it is complete, it is the listing, and the store is asked nothing more. ``format``:
    the job's ``format=``, which the index's entries must have been counted with.

    A directory or a glob is a *root*: a symbolic link found under it (a file, or a directory,
    which is searched like any other) is read when it points inside the root, and refused,
    naming it, when it leads outside, unless ``follow_links``. A file named on its own is read
    wherever it points: naming it is the choice.
    """
    entries = [src] if isinstance(src, (str, os.PathLike)) else list(src)
    if not entries:
        raise SourceError("no source given: pass a file, directory, glob or a list of them")
    files: dict[str, FileStat | None] = {}
    remotes: dict[str, Remote] = {}
    for entry in entries:
        proto = protocol(entry)
        found: dict[str, FileStat | None]
        if proto is not None:
            if proto not in remotes:
                remotes[proto] = Remote(proto, storage or Storage())
            remote = remotes[proto]
            found = dict(_remote_files(remote, os.fspath(entry), storage or Storage(), format, sources))
            whole = _searched_whole(os.fspath(entry), found)
            manifest: Callable[[str], bytes | None] = partial(_manifest, remote)
        else:
            paths, whole = _local_files(entry, follow_links)
            found, manifest = dict.fromkeys(paths), _read_local
        if whole:  # a directory searched whole: its datasets' files in their order, and no documents
            found = without_documents(listed_in_order(found, manifest))
        for f in found:
            if f in files:
                raise SourceError(f"{f} is named twice in the source")
        files.update(found)
    return files


def _remote_files(
    remote: Remote, entry: str, storage: Storage, format: str | None, sources: Sources | None
) -> dict[str, FileStat]:
    """The files a remote entry names: from the complete index published for it, else listed."""
    root = remote_root(entry) if sources is not None else None
    if sources is not None and root is not None:
        url = location(root, storage)
        if url not in sources.found:
            sources.found[url] = read(remote, url, root, named=storage.index_url is not None)
        sources.roots.append((root, url))
        published = sources.found[url]
        if published is not None:
            files = listed(published, entry, format, known_ending)
            if files:
                return files
    return remote.expand(entry, keep=known_ending)


def _searched_whole(entry: str, found: dict[str, FileStat | None]) -> bool:
    """Whether a remote entry is a directory searched whole: not a glob, nor the one file it names."""
    where = entry.split("://", 1)[1].split("?", 1)[0]
    return not glob.has_magic(where) and list(found) != [entry]


def _manifest(remote: Remote, url: str) -> bytes | None:
    """A manifest's bytes (:func:`tidal.formats.ordered.listed_in_order`); None where the store has none."""
    try:
        return remote.cat(url)
    except SourceError:
        return None
    except StorageError as exc:
        if not exc.permanent:
            raise
        return None


def remote_root(entry: str) -> str | None:
    """The directory URL a remote entry names, or the one its glob searches under; None for a
    file (its name has an ending tidal reads) or a URL with a query string (a signed one).

    >>> remote_root("s3://b/web/**/*.parquet")
    's3://b/web'
    """
    scheme, rest = entry.split("://", 1)
    if "?" in rest:
        return None
    if glob.has_magic(rest):
        parts = rest.split("/")
        fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part))
        return f"{scheme}://{'/'.join(parts[:fixed])}".rstrip("/") if fixed else None
    name = rest.rstrip("/").rsplit("/", 1)[-1]
    if not rest.endswith("/") and "." in name and known_ending(name):
        return None
    return entry.rstrip("/")


def _read_local(path: str) -> bytes | None:
    """A local manifest's bytes (:func:`tidal.formats.ordered.listed_in_order`); None where there is none."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SourceError(f"{path}: cannot read it: {exc.strerror or exc}") from exc


def _local_files(entry: str | os.PathLike, follow_links: bool) -> tuple[list[str], bool]:
    """The files a local entry names, and whether it is a directory searched whole."""
    path = os.path.abspath(os.path.expanduser(local_path(entry)))
    if not os.path.exists(path) and glob.has_magic(path):  # a name with [ ] that exists is a name
        root = _glob_root(path)
        rest = path[len(root) :].lstrip(os.sep)
        if "**" in rest:  # searched by the same walk as a directory: links checked, cycles cut
            pattern = glob_pattern(rest)
            rel = len(root.rstrip(os.sep)) + 1
            matches = [(p, real) for p, real in _walk(root, follow_links) if pattern.fullmatch(p[rel:])]
        else:
            reals = _Reals()
            where = os.path.join(glob.escape(root), rest)  # the root's own [ ] are its name
            matches = [(p, reals(p)) for p in glob.glob(where) if os.path.isfile(p)]
        kept = [(p, real) for p, real in matches if not os.path.basename(p).startswith(".")]
        real_root = os.path.realpath(root)
        found = _once(sorted(m for m in kept if _inside(*m, root, real_root, follow_links)))
        if not found:
            raise SourceError(f"{entry}: the pattern matches no file (and no file or directory has this name)")
    elif os.path.isdir(path):
        found = _directory_files(path, follow_links)
        if not found:
            raise SourceError(f"{entry}: the directory holds no file tidal can read")
        return found, True
    elif os.path.isfile(path):
        found = [path]
    else:
        raise SourceError(f"{entry}: no such file or directory")
    return found, False


class _Reals:
    """Real paths, one ``lstat`` for a file that is no link: the real path of its directory is
    looked up once per directory (``os.path.realpath`` costs a system call per path component,
    and a listing may hold a million files)."""

    def __init__(self) -> None:
        self._dirs: dict[str, str] = {}

    def __call__(self, path: str) -> str:
        if os.path.islink(path):
            return os.path.realpath(path)
        d, name = os.path.split(path)
        real = self._dirs.get(d)
        if real is None:
            real = self._dirs[d] = os.path.realpath(d)
        return os.path.join(real, name)


def _directory_files(root: str, follow_links: bool) -> list[str]:
    """The files under ``root`` with an ending tidal reads, sorted; names starting with ``.`` or
    ``_`` left out. A plain file is inside the root when its directory is, so only links cost
    more than a string or two: a directory of a million files lists in seconds."""
    real_root = os.path.realpath(root)
    plain: list[tuple[str, str, list[str]]] = []  # (directory, its real path, names kept)
    linked: list[tuple[str, str]] = []
    for d, real_d, names, links in _walk_dirs(root, follow_links):
        base = d.rstrip(os.sep) + os.sep
        plain.append(
            (base, real_d.rstrip(os.sep) + os.sep, [n for n in names if n[0] not in "._" and known_ending(base + n)])
        )
        for p, real in links:
            name = p[p.rfind(os.sep) + 1 :]
            if name[0] not in "._" and known_ending(p) and _inside(p, real, root, real_root, follow_links):
                linked.append((p, real))
    if not linked:  # each directory was visited once, under one name: no file is listed twice
        return sorted(base + n for base, _, names in plain for n in names)
    both = [(base + n, real_base + n) for base, real_base, names in plain for n in names]
    return _once(sorted(both + linked))


def _walk(root: str, follow_links: bool) -> Iterator[tuple[str, str]]:
    """``(path, real path)`` of every file under ``root``, as :func:`_walk_dirs` finds them."""
    for d, real_d, names, links in _walk_dirs(root, follow_links):
        base, real_base = d.rstrip(os.sep) + os.sep, real_d.rstrip(os.sep) + os.sep
        yield from ((base + n, real_base + n) for n in names)
        yield from links


def _walk_dirs(root: str, follow_links: bool) -> Iterator[tuple[str, str, list[str], list[tuple[str, str]]]]:
    """``(directory, real path, names of its plain files, (path, real path) of its linked
    files)`` for every directory under ``root``, through linked directories too, each directory
    once; a linked directory out of ``root`` refused (:func:`_inside`); directories named ``.*``
    skipped. Only links cost a ``realpath``: a plain file's real path is its directory's and its
    name."""
    real_root = os.path.realpath(root)
    seen = {real_root}
    todo = [(root, real_root)]
    while todo:
        d, real_d = todo.pop()
        try:
            with os.scandir(d) as it:
                entries = list(it)
        except OSError as exc:
            raise SourceError(f"{d}: cannot list the directory: {exc.strerror or exc}") from exc
        names: list[str] = []
        links: list[tuple[str, str]] = []
        for e in entries:
            if e.is_symlink():
                real = os.path.realpath(e.path)
            elif not e.is_dir():
                names.append(e.name)
                continue
            else:
                real = os.path.join(real_d, e.name)
            if e.is_dir():  # follows a link
                if e.name.startswith(".") or not _inside(e.path, real, root, real_root, follow_links):
                    continue
                if real not in seen:  # a second name for a directory, or a link back up the tree
                    seen.add(real)
                    todo.append((e.path, real))
            else:
                links.append((e.path, real))
        yield d, real_d, names, links


def _once(found: list[tuple[str, str]]) -> list[str]:
    """Each file once, under the first of its names: a file reached through two links (or a
    linked directory) is one shard, whichever way it was listed. ``found``: (path, real path)."""
    seen: set[str] = set()
    out = []
    for p, real in found:
        if real not in seen:
            seen.add(real)
            out.append(p)
    return out


def _glob_root(pattern: str) -> str:
    """The directory a glob searches under: its longest leading part that is a directory or has no
    wildcard (a directory named ``corpus [v2]`` is a name, not a pattern)."""
    parts = pattern.split(os.sep)
    fixed = 0
    while fixed < len(parts) - 1:
        here = os.sep.join(parts[: fixed + 1]) or os.sep
        if glob.has_magic(parts[fixed]) and not os.path.isdir(here):
            break
        fixed += 1
    return os.sep.join(parts[:fixed]) or os.sep


def _inside(path: str, real: str, root: str, real_root: str, follow_links: bool) -> bool:
    """True when ``path`` (whose real path is ``real``) is inside ``root`` (``real_root``); a link
    out of it is an error unless followed."""
    if follow_links or real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep):
        return True
    raise SourceError(
        f"{path}: a symbolic link to {real}, outside the dataset's root {root}; "
        "pass follow_links=True (--follow-links on the command line) to read what links outside the root"
    )
