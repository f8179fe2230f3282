"""eos: end-to-end exactly-once Kafka pipelines on Apache Spark.

Importing eos never starts Spark, a JVM or a Kafka client: heavy modules are imported
where they are used.
"""

__version__ = "0.1.0"
