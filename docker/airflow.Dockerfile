# Airflow image for docker-compose.yml: the official Airflow 3 image plus what the platform's DAGs
# need to submit Spark jobs in client mode (a JRE, pyspark, delta-spark, confluent-kafka, the
# Spark provider), installed from the same requirements.lock as the embedded stack.
FROM apache/airflow:3.3.2-python3.11

USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64

USER airflow
COPY requirements.lock /tmp/requirements.lock
# apache-airflow itself comes from the base image; install the rest of the lock around it.
RUN grep -vE '^(apache-airflow|apache-airflow-core|apache-airflow-task-sdk)==' /tmp/requirements.lock > /tmp/reqs.txt \
 && pip install --no-cache-dir -r /tmp/reqs.txt
