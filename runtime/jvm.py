"""JVM dependencies: resolved by Maven at set-up from the manifests in ``jvm/``, never at job start.

Two classpaths come out of it:

* ``<jvm_dir>/kafka-broker``: everything the local Apache Kafka broker needs to run.
* ``<jvm_dir>/spark-jars``: the Kafka connector, Delta and Hadoop's S3A connector jars that every Spark
  session loads through ``spark.jars``. Jars whose artifact the pyspark wheel already ships (Scala,
  Hadoop, Jackson, Parquet, Netty…) are dropped so Spark runs on the exact versions it was built with.
* ``<jvm_dir>/s3-server``: S3Proxy, the local S3-API server tests and benchmarks run against
  (``runtime/s3_server.py``).
* ``<jvm_dir>/state-processors``: the platform's own JVM code (``jvm/state-processors/src``: the
  reference jobs' state logic), compiled with ``javac`` against the pyspark wheel's jars, so it links
  against exactly the Spark it runs in and needs no download. Also on ``spark.jars``.

A ``.resolved`` stamp holding the manifest's hash makes a second set-up a no-op.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from runtime.settings import PROJECT_ROOT, Settings

MANIFEST_DIR = PROJECT_ROOT / "jvm"
MAVEN_SETTINGS = MANIFEST_DIR / "settings.xml"
CLASSPATHS = ("kafka-broker", "spark-jars", "s3-server")
PROCESSORS = "state-processors"
#: Hadoop's local file system without a process per call (jvm/local-fs: ``streamstate.hadoop``), on every Spark
#: JVM's class path (Hadoop loads a file system's class before ``spark.jars`` are added)
LOCAL_FS = "local-fs"
#: the Java sources set-up compiles against pyspark's jars (jvm/<name>/src), each into one jar
BUILT_JARS = {PROCESSORS: "streamstate-processors-1.0.jar", LOCAL_FS: "streamstate-local-fs-1.0.jar"}

#: The Java versions Spark 4.2 runs on, each from its first supported update (25 from 25.0.3: SPARK-56843).
SPARK_JAVA_VERSIONS = {17: (17,), 21: (21,), 25: (25, 0, 3)}
#: Where Linux packages install JDKs (Debian's openjdk-*-jdk, Adoptium's temurin-*-jdk, Fedora's java-*).
JDK_DIRS = (Path("/usr/lib/jvm"),)

# The version starts at the first "-<digits>.<digit>": "kafka-clients-3.9.2.jar" -> "kafka-clients",
# "zstd-jni-1.5.7-3.jar" -> "zstd-jni", "spark-sql-kafka-0-10_2.13-4.2.0.jar" -> "spark-sql-kafka-0-10_2.13".
_ARTIFACT_OF_JAR = re.compile(r"^(?P<artifact>.+?)-\d+\.\d[\w.\-]*\.jar$")


class JvmDependencyError(RuntimeError):
    """Maven could not resolve a manifest, or resolved jars are missing."""


def artifact_name(jar_file: str) -> str:
    match = _ARTIFACT_OF_JAR.match(jar_file)
    if not match:
        raise JvmDependencyError(f"cannot tell the artifact of jar file {jar_file!r}")
    return match.group("artifact")


def pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _manifest_hash(name: str) -> str:
    digest = hashlib.sha256()
    for path in (MANIFEST_DIR / name / "pom.xml", MAVEN_SETTINGS, Path(__file__)):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def resolve(settings: Settings, *, force: bool = False, log=print) -> dict[str, list[Path]]:
    """Resolve every classpath with Maven (idempotent). Returns the jars of each classpath."""
    result = {}
    for name in CLASSPATHS:
        target = settings.jvm_dir / name
        stamp = target / ".resolved"
        wanted = _manifest_hash(name)
        if not force and stamp.exists() and stamp.read_text() == wanted:
            result[name] = jars(settings, name)
            continue
        log(f"resolving JVM classpath {name} with Maven (from jvm/{name}/pom.xml)")
        with tempfile.TemporaryDirectory(prefix=f"mvn-{name}-") as staging:
            _copy_dependencies(MANIFEST_DIR / name, Path(staging))
            shipped = (
                {artifact_name(j.name) for j in pyspark_jars_dir().glob("*.jar")} if name == "spark-jars" else set()
            )
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            for jar in sorted(Path(staging).glob("*.jar")):
                if artifact_name(jar.name) not in shipped:
                    shutil.copy2(jar, target / jar.name)
        stamp.write_text(wanted)
        result[name] = jars(settings, name)
    for name in BUILT_JARS:
        result[name] = [build_jar(settings, name, force=force, log=log)]
    return result


def _sources_hash(name: str) -> str:
    import pyspark

    digest = hashlib.sha256(f"pyspark {pyspark.__version__}".encode())
    for path in sorted((MANIFEST_DIR / name / "src").rglob("*.java")):
        digest.update(path.relative_to(MANIFEST_DIR).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def build_processors(settings: Settings, *, force: bool = False, log=print) -> Path:
    """Compile ``jvm/state-processors`` into one jar (see :func:`build_jar`)."""
    return build_jar(settings, PROCESSORS, force=force, log=log)


def build_jar(settings: Settings, name: str, *, force: bool = False, log=print) -> Path:
    """Compile ``jvm/<name>/src`` into one jar (idempotent: a stamp holds the sources' hash, and an unchanged
    jar keeps its time stamp, which the drivers' class archive is keyed on)."""
    target = settings.jvm_dir / name
    jar, stamp, wanted = target / BUILT_JARS[name], target / ".built", _sources_hash(name)
    if not force and jar.exists() and stamp.exists() and stamp.read_text() == wanted:
        return jar
    log(f"compiling jvm/{name} against pyspark's jars")
    sources = sorted(str(p) for p in (MANIFEST_DIR / name / "src").rglob("*.java"))
    with tempfile.TemporaryDirectory(prefix="javac-") as classes:
        compile_cmd = ["javac", "--release", "17", "-nowarn", "-cp", f"{pyspark_jars_dir()}/*", "-d", classes, *sources]
        proc = subprocess.run(compile_cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise JvmDependencyError(f"javac failed for jvm/{name}:\n{(proc.stdout + proc.stderr).strip()}")
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        subprocess.run(["jar", "cf", str(jar), "-C", classes, "."], check=True, capture_output=True)
    stamp.write_text(wanted)
    return jar


def _copy_dependencies(manifest: Path, out: Path) -> None:
    cmd = [
        "mvn",
        "-B",
        "-q",
        "-s",
        str(MAVEN_SETTINGS),
        "-f",
        str(manifest / "pom.xml"),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={out}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise JvmDependencyError(f"Maven failed to resolve {manifest.name} ({' '.join(cmd)}):\n{tail}")


def jars(settings: Settings, name: str) -> list[Path]:
    """The resolved jars of one classpath; raises with the fix when set-up has not run."""
    directory = settings.jvm_dir / name
    found = sorted(directory.glob("*.jar"))
    if not found:
        raise JvmDependencyError(
            f"no jars in {directory}: run `make setup` (or `python -m streamstate_cli setup-jvm`) to resolve them"
        )
    return found


def spark_jars(settings: Settings) -> list[Path]:
    """Everything a Spark session adds through ``spark.jars``: the resolved connector/Delta jars, the
    platform's compiled processors and the deployment's ``extra_jars``."""
    extra = [Path(p.strip()) for p in (settings.extra_jars or "").split(",") if p.strip()]
    if missing := [str(p) for p in extra if not p.is_file()]:
        raise JvmDependencyError(f"STREAMSTATE_EXTRA_JARS names jars that do not exist: {', '.join(missing)}")
    return [*jars(settings, "spark-jars"), *jars(settings, PROCESSORS), *extra]


def local_fs_jar(settings: Settings) -> Path:
    """The jar of ``streamstate.hadoop`` (see :data:`LOCAL_FS`); raises with the fix when set-up has not built it."""
    (jar,) = jars(settings, LOCAL_FS)
    return jar


def broker_classpath(settings: Settings) -> str:
    return ":".join(str(p) for p in jars(settings, "kafka-broker"))


def _jdk_version(home: Path) -> tuple[int, ...] | None:
    """A JDK's version from its ``release`` file (every JDK since 9 has one); None when ``home`` is no JDK."""
    release = home / "release"
    if not (home / "bin" / "java").is_file() or not release.is_file():
        return None
    match = re.search(r'^JAVA_VERSION="(\d+(?:\.\d+)*)', release.read_text(errors="replace"), re.MULTILINE)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def spark_supports(version: tuple[int, ...]) -> bool:
    minimum = SPARK_JAVA_VERSIONS.get(version[0])
    return minimum is not None and version >= minimum


def java_home(settings: Settings) -> Path | None:
    """The JDK every JVM the platform starts runs on: Spark drivers (pyspark's gateway and spark-submit
    alike), a standalone cluster's master and worker, the local Kafka broker and S3-API server, and the
    Kafka Streams peer of the benchmarks, so that ratios between them compare like with like.

    ``STREAMSTATE_JAVA_HOME`` when set; else ``JAVA_HOME``, as Spark's own launcher; else the newest JDK
    under :data:`JDK_DIRS` that Spark supports (a newer JVM starts Spark faster: a cold restore of 1e7 keys
    took 8-15% less on JDK 25 than on 17, BENCHMARKS.md); else None, and ``java`` on the path runs.
    """
    if settings.java_home is not None:
        return settings.java_home
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    installed = {
        home.resolve(): version
        for directory in JDK_DIRS
        if directory.is_dir()
        for home in directory.iterdir()
        if (version := _jdk_version(home)) is not None and spark_supports(version)
    }
    return max(installed, key=lambda home: (installed[home], str(home))) if installed else None


def java_binary(settings: Settings) -> str:
    """The ``java`` of :func:`java_home` (``java`` on the path without one)."""
    home = java_home(settings)
    return str(home / "bin" / "java") if home is not None else shutil.which("java") or "java"


def java_env(settings: Settings) -> dict[str, str]:
    """``JAVA_HOME`` for a process that starts a JVM through a launcher script (spark-submit, spark-class)."""
    home = java_home(settings)
    return {"JAVA_HOME": str(home)} if home is not None else {}
