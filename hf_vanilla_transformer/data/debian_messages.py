"""The messages of command-line tools (`--dataset debian-messages`): a second adaptation corpus, far from the
LibreOffice help, from the gettext catalogues that Debian's packages of compilers, version control, package managers,
file and text tools, system services and editors ship for each language.

Another kind of text than the help's: error and usage messages, `--help` screens, diagnostics with placeholders
(`%s`, `%d`, `{}`), terse imperative phrases, and another vocabulary (compilers' and file systems' terms, options,
units). The packages (`PACKAGES`) are fetched as the LibreOffice ones are (`libreoffice.fetch_debian_package`:
`apt-get download`, `dpkg-deb -x`, size caps, nothing followed out of the package), each package's catalogues of the
language read (`usr/share/locale/<lang>/LC_MESSAGES/*.mo`: msgid English, msgstr the translation), and the pairs
split by message as the UI strings are (`libreoffice.message_split`: a hash of the English text, so that every copy
of a message lands in one split) and de-duplicated. A package that holds no catalogue of the language is skipped,
and the log says which were read; the cached corpus is named by the list of packages (another list, another corpus).
"""

from __future__ import annotations

import logging
from pathlib import Path

from datasets import DatasetDict

from .cache import cache_root, text_key
from .libreoffice import (
    _cached_corpus,
    _check_not_empty,
    debian_language,
    fetch_debian_package,
    inside,
    message_split,
    read_mo_catalogue,
    split_and_deduplicate,
)
from .splits import CorpusError


logger = logging.getLogger(__name__)

# Debian 12 packages whose gettext catalogues hold the messages of command-line and system tools: about 40,000 EN-DE
# pairs in all. Packages that split their translations out (`-l10n`, `-locales`) are named by those.
PACKAGES = (
    "coreutils", "findutils", "diffutils", "grep", "sed", "gawk", "tar", "wget", "make", "bison", "gettext",
    "texinfo", "gcc-12-locales", "cpp-12", "binutils-common", "git", "apt", "dpkg", "aptitude-common", "synaptic",
    "util-linux-locales", "e2fsprogs-l10n", "libc-l10n", "gnupg-l10n", "sudo", "systemd", "psmisc", "procps",
    "man-db", "passwd", "lvm2", "cryptsetup-bin", "mc", "nano",
)  # fmt: skip


def message_catalogues(unpacked: Path, folder: str) -> list[Path]:
    """The gettext catalogues of language `folder` (de, pt_BR, ...) in an unpacked package, links out of it skipped."""
    root = unpacked / "usr/share/locale" / folder / "LC_MESSAGES"
    return sorted(path for path in root.glob("*.mo") if inside(path, unpacked))


def locale_folder(target_lang: str) -> str:
    """The locale folder of a language code: 'de' -> 'de', 'pt-BR' -> 'pt_BR'."""
    _, folder = debian_language(target_lang)
    return folder.replace("-", "_")


def debian_messages_corpus(
    source_lang: str = "en", target_lang: str = "de", cache_dir: str | Path | None = None
) -> DatasetDict:
    """The command-line tools' messages for a language pair (see the module docstring), built once and cached."""
    if source_lang.lower() not in ("en", "en-us"):
        raise ValueError(f"source_lang={source_lang!r}: the tools' messages are written in English; use 'en'.")
    folder, cache_dir = locale_folder(target_lang), cache_root(cache_dir)

    def build() -> DatasetDict:
        rows, read = [], []
        for package in PACKAGES:
            catalogues = message_catalogues(fetch_debian_package(package, cache_dir), folder)
            if catalogues:
                read.append(package)
            for path in catalogues:
                rows += [(english, english, translation) for english, translation in read_mo_catalogue(path)]
        if not rows:
            raise CorpusError(f"None of the {len(PACKAGES)} packages holds messages in {target_lang!r} ({folder}).")
        logger.info("debian-messages: %d messages of %d packages (%s)", len(rows), len(read), ", ".join(read))
        corpus = split_and_deduplicate(rows, split_of=message_split)
        _check_not_empty(corpus, "the tools' catalogues")
        return corpus

    name = f"debian-messages-en-{folder.lower()}-{text_key(PACKAGES)[:8]}"  # another list of packages: another corpus
    return _cached_corpus(cache_dir / name, cache_dir, build)
