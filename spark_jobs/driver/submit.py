"""How a registered job is handed to ``spark-submit``: one description, used by every launcher.

The Airflow DAGs (``SparkSubmitOperator``), the CLI and the standalone-cluster test all build their
command from :func:`submit_spec`, so a job runs with the same jars, Spark configuration, Python
files and environment whichever way it is started.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import shutil
import sys
import zipfile
from pathlib import Path

from runtime.settings import PROJECT_ROOT, Settings
from spark_jobs.driver.session import launch_env, spark_conf
from spark_jobs.driver.spare import spare_driver_settings
from spark_jobs.registry import JobSpec, JobSpecError

ENTRY_FILE = PROJECT_ROOT / "spark_jobs" / "driver" / "run.py"
PACKAGES = ("runtime", "spark_jobs")


def spark_submit_binary() -> str:
    """The spark-submit of this environment's pyspark (so its Spark matches the pinned one)."""
    beside_python = Path(sys.executable).parent / "spark-submit"
    return str(beside_python) if beside_python.exists() else (shutil.which("spark-submit") or "spark-submit")


@dataclasses.dataclass(frozen=True)
class SubmitSpec:
    """Everything spark-submit needs for one job run."""

    name: str
    master: str
    application: str
    application_args: tuple[str, ...]
    conf: dict[str, str]
    jars: str
    py_files: str
    env: dict[str, str]

    def command(self, spark_submit: str | None = None, *, queue: str | None = None) -> list[str]:
        """The spark-submit command line (``spark_submit``: the binary, default this environment's;
        ``queue``: the YARN queue)."""
        cmd = [
            spark_submit or spark_submit_binary(),
            "--master",
            self.master,
            "--name",
            self.name,
            "--deploy-mode",
            "client",
        ]
        if queue:
            cmd += ["--queue", queue]
        for key, value in self.conf.items():
            cmd += ["--conf", f"{key}={value}"]
        cmd += ["--jars", self.jars, "--py-files", self.py_files, self.application, *self.application_args]
        return cmd


def package_python(settings: Settings) -> Path:
    """Zip the platform's Python packages and the deployment's job modules (``job_modules``: the module's
    top-level package, or the module file) for ``--py-files``: executors on a cluster import them.

    The archive name carries a content hash, so a changed job never runs stale code on executors.
    """
    files = {  # path in the archive -> file
        p.relative_to(PROJECT_ROOT).as_posix(): p
        for pkg in PACKAGES
        for p in (PROJECT_ROOT / pkg).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    for module in filter(None, (m.strip() for m in (settings.job_modules or "").split(","))):
        files.update(_module_files(module))
    files = dict(sorted(files.items()))
    digest = hashlib.sha256()
    for name, path in files.items():
        digest.update(name.encode() + b"\0" + path.read_bytes())
    target = settings.data_dir / "dist" / f"streamstate-{digest.hexdigest()[:12]}.zip"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, path in files.items():
                archive.write(path, name)
        tmp.replace(target)
    return target


def _module_files(module: str) -> dict[str, Path]:
    """The Python files that make ``module`` importable: its top-level package's, or its own file."""
    top = module.split(".")[0]
    found = importlib.util.find_spec(top)
    if found is None or found.origin is None and not found.submodule_search_locations:
        raise JobSpecError(f"job module {module!r} (STREAMSTATE_JOB_MODULES) cannot be found to ship to executors")
    if found.submodule_search_locations:  # a package: all of it, under its name
        root = Path(next(iter(found.submodule_search_locations)))
        return {
            (Path(top) / p.relative_to(root)).as_posix(): p for p in root.rglob("*.py") if "__pycache__" not in p.parts
        }
    return {Path(found.origin).name: Path(found.origin)}


def submit_spec(spec: JobSpec, settings: Settings, *, available_now: bool = False, spare: bool = False) -> SubmitSpec:
    """The spark-submit of ``spec``'s driver (``available_now``: drain and stop; ``spare``: its spare driver)."""
    mode = ["--available-now"] if available_now else ["--spare"] if spare else []
    if spare:
        settings = spare_driver_settings(settings)
    return application_submit_spec(
        settings, spec.application_id, ENTRY_FILE, (spec.name, "--version", str(spec.version), *mode)
    )


def application_submit_spec(settings: Settings, name: str, application: Path, args: tuple[str, ...]) -> SubmitSpec:
    """Any platform application (a job's driver, the reprocessing comparison) with the same jars,
    configuration, Python files and environment."""
    conf = spark_conf(settings)
    jars = conf.pop("spark.jars")
    return SubmitSpec(
        name=name,
        master=settings.spark_master,
        application=str(application),
        application_args=tuple(args),
        conf=conf,
        jars=jars,
        py_files=str(package_python(settings)),
        env={**settings.to_env(), **launch_env(settings)},
    )
