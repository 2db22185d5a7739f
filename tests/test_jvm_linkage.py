"""The Spark Kafka token provider is pinned below Spark (see versions.toml). Re-run the audit that
justified it: every Spark symbol it links must exist in pyspark's jars, except the two LogKeys known
to be used only by Kerberos delegation tokens, and nothing on the path the platform uses may need them."""

from __future__ import annotations

import re
import subprocess
import zipfile
from collections import defaultdict

from runtime import jvm

KNOWN_MISSING = {"org/apache/spark/internal/LogKeys$CLUSTER_ID$", "org/apache/spark/internal/LogKeys$SERVICE_NAME$"}
REF = re.compile(r"// (?:Method|Field|InterfaceMethod) (org/apache/spark/[\w/$]+)\.([\w$]+)")


def test_token_provider_links_against_pyspark(settings, tmp_path):
    jar = next(p for p in jvm.spark_jars(settings) if p.name.startswith("spark-token-provider-kafka"))
    with zipfile.ZipFile(jar) as archive:
        archive.extractall(tmp_path)
    classes = [str(p) for p in tmp_path.rglob("*.class")]
    disassembly = subprocess.run(["javap", "-c", "-p", *classes], capture_output=True, text=True, check=True).stdout

    refs: dict[str, set[str]] = defaultdict(set)
    users_of_missing: set[str] = set()
    method = ""
    for line in disassembly.splitlines():
        if re.match(r"^  \S.*\(", line):
            method = line.strip()
        for owner, member in REF.findall(line):
            if "/kafka010/" not in owner:
                refs[owner].add(member)
            if owner in KNOWN_MISSING:
                users_of_missing.add(method)

    classpath = ":".join(str(p) for p in jvm.pyspark_jars_dir().glob("*.jar"))
    # One javap for every class (one JVM per class cost ~8 s in all): its output is one block per class found, each
    # starting at the class's declaration line, which names it.
    owners = sorted(refs)
    out = subprocess.run(
        ["javap", "-p", "-cp", classpath, *(o.replace("/", ".") for o in owners)], capture_output=True, text=True
    ).stdout
    blocks: dict[str, str] = {}
    current = None
    for line in out.splitlines():
        declared = re.match(r"^(?:[\w$]+ )*(?:class|interface|enum) ([\w.$]+)", line)
        if declared:
            current = declared.group(1).replace(".", "/")
            blocks[current] = ""
        elif current is not None:
            blocks[current] += line + "\n"
    missing = set()
    for owner, members in refs.items():
        if owner not in blocks:
            missing.add(owner)
            continue
        body = blocks[owner]
        missing |= {
            f"{owner}.{m}" for m in members if m != "<init>" and not re.search(rf"[ .]{re.escape(m)}[(; ]", body)
        }
    assert missing == KNOWN_MISSING
    assert users_of_missing and all("obtainDelegationTokens" in m for m in users_of_missing), users_of_missing
