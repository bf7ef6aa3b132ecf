"""What the appendix PDF needs of the TeX installation: ``latexmk``, and the LaTeX packages that
paper/main.tex loads beyond those of latexmk's TeX (found with ``kpsewhich``), each with the Debian
package that installs it. ``attnid appendix --pdf`` refuses to start without them, and the workflow's
``paper_pdf: auto`` builds the PDF only where nothing is missing (docs/experiments.md)."""

from __future__ import annotations

import shutil
import subprocess

# The LaTeX packages paper/main.tex loads beyond those of latexmk's TeX, and the Debian package of each.
TEX_PACKAGES = {"siunitx.sty": "texlive-science"}
# What installs a TeX that compiles the appendix (the README's apt line, its TeX part).
TEX_INSTALL = "apt-get install latexmk texlive-latex-recommended texlive-science"


def missing_tex_packages() -> list[str]:
    """The files of :data:`TEX_PACKAGES` that ``kpsewhich`` does not find (none where there is no kpsewhich:
    then there is no TeX, and latexmk's absence says so)."""
    kpsewhich = shutil.which("kpsewhich")
    if kpsewhich is None:
        return []
    return [
        name
        for name in TEX_PACKAGES
        if not subprocess.run([kpsewhich, name], capture_output=True, text=True).stdout.strip()
    ]


def why_no_pdf() -> str | None:
    """Why the appendix PDF cannot be built here, in one line that says what installs the missing part;
    None where latexmk and every package of :data:`TEX_PACKAGES` are found."""
    if shutil.which("latexmk") is None:
        return f"latexmk not found: install TeX (e.g. {TEX_INSTALL})"
    missing = missing_tex_packages()
    if missing:
        packages = " ".join(sorted({TEX_PACKAGES[name] for name in missing}))
        return (
            f"{', '.join(missing)} not found (the appendix sets its numbers with siunitx): "
            f"apt-get install {packages}"
        )
    return None
