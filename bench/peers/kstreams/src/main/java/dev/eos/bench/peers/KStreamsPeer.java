package dev.eos.bench.peers;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.management.ManagementFactory;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.LongAdder;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.common.utils.Utils;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.processor.StreamPartitioner;
import org.apache.kafka.streams.processor.TimestampExtractor;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.state.WindowStoreIterator;

/**
 * The benchmark's pipelines as a Kafka Streams application with processing.guarantee=exactly_once_v2:
 * the peer baseline a JVM team would write instead of eos.
 *
 * <p>stateless: Avro AdEvent -> drop heartbeats and campaign-00 -> AdView (event_id, campaign_id,
 * event_type as a string, event_time) -> output, keyed by event_id.
 *
 * <p>stateful: the demo (examples/ad_attribution.yaml): drop events older than the watermark (task
 * stream time - 1 minute), drop a repeated event_id while it is within the watermark, count
 * impressions and clicks per campaign per event-time minute, emit each window once when it closes
 * (grace 1 minute, suppress until the window closes).
 *
 * <p>Avro is plain schemaless binary (GenericDatumReader/Writer with the .avsc files), as the input is
 * written: there is no Schema Registry, so Confluent's GenericAvroSerde does not apply.
 *
 * <p>It stops by itself: the input's end offsets (read_committed) are given (--ends) or taken at start; a watcher
 * asks the broker for the application's committed offsets until they reach those ends (and, for the
 * stateful pipeline, the ends of its repartition topic); under exactly_once_v2 offsets become visible
 * only when the transaction that wrote the output commits, so at that point all output is committed.
 * Then it closes cleanly and writes a JSON summary to --result.
 *
 * <p>On a live input (the latency probe's) there is no end: with --live READY_FILE it writes READY_FILE once its
 * stream threads run (state RUNNING: the group joined, the tasks assigned), and runs until its standard input
 * closes; then it closes cleanly (committing what it has) and writes the summary. A runner that dies closes that
 * input too, so the peer never outlives it.
 */
public final class KStreamsPeer {
    static final long MINUTE_MS = 60_000L;
    static final long WATERMARK_DELAY_MS = 60_000L;
    static final String SEEN_STORE = "seen-event-ids";

    static final LongAdder RECORDS_IN = new LongAdder();
    static final LongAdder RECORDS_OUT = new LongAdder();
    static final AtomicLong FIRST_RECORD_MS = new AtomicLong(0);
    static final AtomicLong CPU_AT_FIRST_RECORD_NS = new AtomicLong(0);

    private KStreamsPeer() {}

    public static void main(String[] args) throws Exception {
        if (System.getProperty("org.slf4j.simpleLogger.defaultLogLevel") == null) {
            System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        }
        Map<String, String> opts = parseArgs(args);
        String bootstrap = required(opts, "bootstrap");
        String input = required(opts, "input");
        String output = required(opts, "output");
        String appId = required(opts, "application-id");
        String pipeline = opts.getOrDefault("pipeline", "stateless");
        String live = opts.get("live");
        Schema eventSchema = readSchema(required(opts, "event-schema"));
        Schema outSchema = readSchema(required(opts, "output-schema"));
        long started = System.currentTimeMillis();

        Properties adminProps = new Properties();
        adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(adminProps)) {
            Map<TopicPartition, Long> ends = live != null
                    ? Map.of()
                    : opts.containsKey("ends")
                    ? parseEnds(input, opts.get("ends"))
                    : endOffsets(admin, inputPartitions(admin, input));
            long expected = ends.values().stream().mapToLong(Long::longValue).sum();

            Properties props = new Properties();
            props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
            props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
            props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, opts.getOrDefault("threads", "2"));
            props.put(StreamsConfig.STATE_DIR_CONFIG, opts.containsKey("state-dir")
                    ? opts.get("state-dir")
                    : Files.createTempDirectory("kstreams-peer").toString());
            props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
            if (opts.containsKey("commit-interval-ms")) {
                props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, opts.get("commit-interval-ms"));
            }
            Topology topology = "stateful".equals(pipeline)
                    ? statefulTopology(input, output, eventSchema, outSchema)
                    : statelessTopology(input, output, eventSchema, outSchema);

            KafkaStreams streams = new KafkaStreams(topology, props);
            CountDownLatch failed = new CountDownLatch(1);
            streams.setUncaughtExceptionHandler(e -> {
                e.printStackTrace();
                failed.countDown();
                return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
            });
            if (live != null) {
                streams.setStateListener((now, before) -> {
                    if (now == KafkaStreams.State.RUNNING) {
                        try {
                            Files.writeString(Path.of(live), "running\n");
                        } catch (IOException e) {
                            throw new UncheckedIOException(e);
                        }
                    }
                });
            }
            Runtime.getRuntime().addShutdownHook(new Thread(() -> streams.close(Duration.ofSeconds(30))));
            streams.start();
            long deadline = started + Long.parseLong(opts.getOrDefault("timeout-s", "600")) * 1000;
            Set<String> internal = "stateful".equals(pipeline) ? Set.of(appId + "-by-campaign-repartition") : Set.of();
            long doneAt = live != null
                    ? waitUntilInputCloses(streams, failed, deadline)
                    : waitUntilCommitted(admin, appId, ends, internal, streams, failed, deadline);
            long cpuAtDone = processCpuNs();
            streams.close(Duration.ofSeconds(60));
            long closed = System.currentTimeMillis();
            String result = String.format(Locale.ROOT,
                    "{\"ok\": %s, \"records_expected\": %d, \"records_in\": %d, \"records_out\": %d, "
                            + "\"started_ms\": %d, \"first_record_ms\": %d, \"committed_ms\": %d, \"closed_ms\": %d, "
                            + "\"cpu_at_first_record_s\": %.3f, \"cpu_at_done_s\": %.3f, \"cpu_at_close_s\": %.3f, "
                            + "\"threads\": %s, \"pipeline\": \"%s\"}",
                    doneAt > 0, expected, RECORDS_IN.sum(), RECORDS_OUT.sum(), started, FIRST_RECORD_MS.get(),
                    doneAt, closed, CPU_AT_FIRST_RECORD_NS.get() / 1e9, cpuAtDone / 1e9, processCpuNs() / 1e9,
                    props.get(StreamsConfig.NUM_STREAM_THREADS_CONFIG), pipeline);
            if (opts.containsKey("result")) {
                Files.writeString(Path.of(opts.get("result")), result + "\n");
            }
            System.out.println(result);
            System.exit(doneAt > 0 ? 0 : 1);
        }
    }

    // -----------------------------------------------------------------------------------------
    // Topologies
    // -----------------------------------------------------------------------------------------

    static Topology statelessTopology(String input, String output, Schema eventSchema, Schema viewSchema) {
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), avroSerde(eventSchema)))
                .peek((k, e) -> countIn())
                .filter((k, e) -> !"heartbeat".equals(e.get("event_type").toString())
                        && !"campaign-00".equals(e.get("campaign_id").toString()))
                .map((k, e) -> {
                    GenericRecord view = new GenericData.Record(viewSchema);
                    view.put("event_id", e.get("event_id"));
                    view.put("campaign_id", e.get("campaign_id"));
                    view.put("event_type", e.get("event_type").toString());
                    view.put("event_time", e.get("event_time"));
                    return KeyValue.pair(e.get("event_id").toString(), view);
                })
                .peek((k, v) -> RECORDS_OUT.increment())
                .to(output, Produced.with(Serdes.String(), avroSerde(viewSchema)));
        return builder.build();
    }

    static Topology statefulTopology(String input, String output, Schema eventSchema, Schema countsSchema) {
        StreamsBuilder builder = new StreamsBuilder();
        // Retention covers the watermark delay: an event_id is remembered while a duplicate of it
        // could still be within the watermark.
        builder.addStateStore(Stores.windowStoreBuilder(
                Stores.persistentWindowStore(SEEN_STORE, Duration.ofMillis(2 * WATERMARK_DELAY_MS), Duration.ofMillis(1), false),
                Serdes.String(), Serdes.Long()));
        KStream<String, GenericRecord> events = builder.stream(
                input, Consumed.with(Serdes.String(), avroSerde(eventSchema)).withTimestampExtractor(new EventTime()));
        events.peek((k, e) -> countIn())
                .process(Dedup::new, SEEN_STORE)
                .repartition(Repartitioned.with(Serdes.String(), Serdes.String())
                        .withName("by-campaign")
                        .withStreamPartitioner(new HeartbeatsToAll()))
                .groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
                .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(MINUTE_MS), Duration.ofMillis(WATERMARK_DELAY_MS)))
                .aggregate(() -> new long[2], (campaign, type, counts) -> {
                    long[] next = counts.clone();
                    if ("impression".equals(type)) {
                        next[0]++;
                    } else if ("click".equals(type)) {
                        next[1]++;
                    }
                    return next;
                }, Materialized.<String, long[], WindowStore<Bytes, byte[]>>as("campaign-counts")
                        .withKeySerde(Serdes.String())
                        .withValueSerde(countsSerde()))
                .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
                .toStream()
                // A window that saw only heartbeats (they advance event time, they are not counted).
                .filter((window, counts) -> counts[0] + counts[1] > 0)
                .process(() -> new CountsRow(countsSchema))
                .to(output, Produced.with(Serdes.String(), avroSerde(countsSchema)));
        return builder.build();
    }

    static void countIn() {
        RECORDS_IN.increment();
        if (FIRST_RECORD_MS.get() == 0 && FIRST_RECORD_MS.compareAndSet(0, System.currentTimeMillis())) {
            CPU_AT_FIRST_RECORD_NS.set(processCpuNs());
        }
    }

    /**
     * A closed window as the output row, keyed campaign|yyyy-MM-ddTHH:mm (UTC), stamped with the time
     * it is produced: the window's own timestamp is event time (2026-01-01 in the benchmark's input),
     * which the broker's time-based retention would delete at once.
     */
    static final class CountsRow implements Processor<Windowed<String>, long[], String, GenericRecord> {
        private static final DateTimeFormatter MINUTE =
                DateTimeFormatter.ofPattern("yyyy-MM-dd'T'HH:mm").withZone(ZoneOffset.UTC);
        private final Schema schema;
        private ProcessorContext<String, GenericRecord> context;

        CountsRow(Schema schema) {
            this.schema = schema;
        }

        @Override
        public void init(ProcessorContext<String, GenericRecord> context) {
            this.context = context;
        }

        @Override
        public void process(Record<Windowed<String>, long[]> window) {
            long start = window.key().window().start();
            GenericRecord row = new GenericData.Record(schema);
            row.put("campaign_id", window.key().key());
            row.put("window_start", start);
            row.put("window_end", start + MINUTE_MS);
            row.put("impressions", window.value()[0]);
            row.put("clicks", window.value()[1]);
            RECORDS_OUT.increment();
            String key = window.key().key() + "|" + MINUTE.format(Instant.ofEpochMilli(start));
            context.forward(new Record<>(key, row, System.currentTimeMillis()));
        }
    }

    /** CPU time of the whole JVM (every thread: stream threads, producer I/O, GC, JIT), ns. */
    static long processCpuNs() {
        return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean()).getProcessCpuTime();
    }

    /** Event time is the record's timestamp (as the watermark column in the eos pipeline). */
    static final class EventTime implements TimestampExtractor {
        @Override
        public long extract(ConsumerRecord<Object, Object> record, long partitionTime) {
            Object value = record.value();
            if (value instanceof GenericRecord event) {
                return (Long) event.get("event_time");
            }
            return record.timestamp();
        }
    }

    /**
     * Drops events older than the watermark and repeated event_ids within it; forwards (campaign,
     * event type) with the event time as the record's timestamp. The watermark is the task's stream
     * time (the largest event time its input partition has shown) minus the delay: Kafka Streams
     * keeps event time per task, where Spark keeps one watermark for the query. Heartbeats are
     * forwarded too, so that the aggregation downstream sees event time advance.
     */
    static final class Dedup implements Processor<String, GenericRecord, String, String> {
        private ProcessorContext<String, String> context;
        private WindowStore<String, Long> seen;

        @Override
        public void init(ProcessorContext<String, String> context) {
            this.context = context;
            this.seen = context.getStateStore(SEEN_STORE);
        }

        @Override
        public void process(Record<String, GenericRecord> record) {
            long time = record.timestamp();
            long now = context.currentStreamTimeMs();
            long watermark = now - WATERMARK_DELAY_MS;
            if (time < watermark) {
                return;
            }
            GenericRecord event = record.value();
            String id = event.get("event_id").toString();
            try (WindowStoreIterator<Long> earlier = seen.fetch(id, Math.max(0, watermark), now)) {
                if (earlier.hasNext()) {
                    return;
                }
            }
            seen.put(id, time, time);
            String type = event.get("event_type").toString();
            context.forward(new Record<>(event.get("campaign_id").toString(), type, time));
        }
    }

    /**
     * The repartition by campaign sends a heartbeat to every partition: each downstream task keeps
     * its own stream time, and the heartbeat is what closes the last windows (as the demo's watermark).
     * Everything else goes where the default partitioner would send it (murmur2 of the key).
     */
    static final class HeartbeatsToAll implements StreamPartitioner<String, String> {
        @Override
        public Optional<Set<Integer>> partitions(String topic, String key, String value, int numPartitions) {
            if ("heartbeat".equals(value)) {
                Set<Integer> all = new HashSet<>();
                for (int p = 0; p < numPartitions; p++) {
                    all.add(p);
                }
                return Optional.of(all);
            }
            byte[] bytes = key.getBytes(StandardCharsets.UTF_8);
            return Optional.of(Set.of(Utils.toPositive(Utils.murmur2(bytes)) % numPartitions));
        }
    }

    // -----------------------------------------------------------------------------------------
    // Avro: plain binary, no registry framing
    // -----------------------------------------------------------------------------------------

    static Serde<GenericRecord> avroSerde(Schema schema) {
        // Kafka Streams shares one serde between its stream threads: per-thread readers, writers and
        // buffers, reused from record to record.
        ThreadLocal<GenericDatumReader<GenericRecord>> readers = ThreadLocal.withInitial(() -> new GenericDatumReader<>(schema));
        ThreadLocal<BinaryDecoder[]> decoders = ThreadLocal.withInitial(() -> new BinaryDecoder[1]);
        ThreadLocal<GenericDatumWriter<GenericRecord>> writers = ThreadLocal.withInitial(() -> new GenericDatumWriter<>(schema));
        ThreadLocal<ByteArrayOutputStream> buffers = ThreadLocal.withInitial(() -> new ByteArrayOutputStream(256));
        ThreadLocal<BinaryEncoder[]> encoders = ThreadLocal.withInitial(() -> new BinaryEncoder[1]);
        Deserializer<GenericRecord> deserializer = (topic, data) -> {
            if (data == null) {
                return null;
            }
            BinaryDecoder[] decoder = decoders.get();
            decoder[0] = DecoderFactory.get().binaryDecoder(data, decoder[0]);
            try {
                return readers.get().read(null, decoder[0]);
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        };
        Serializer<GenericRecord> serializer = (topic, record) -> {
            if (record == null) {
                return null;
            }
            ByteArrayOutputStream out = buffers.get();
            out.reset();
            BinaryEncoder[] encoder = encoders.get();
            encoder[0] = EncoderFactory.get().binaryEncoder(out, encoder[0]);
            try {
                writers.get().write(record, encoder[0]);
                encoder[0].flush();
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
            return out.toByteArray();
        };
        return Serdes.serdeFrom(serializer, deserializer);
    }

    static Serde<long[]> countsSerde() {
        Serializer<long[]> serializer = (topic, counts) -> counts == null
                ? null
                : ByteBuffer.allocate(16).putLong(counts[0]).putLong(counts[1]).array();
        Deserializer<long[]> deserializer = (topic, data) -> {
            if (data == null) {
                return null;
            }
            ByteBuffer buffer = ByteBuffer.wrap(data);
            return new long[] {buffer.getLong(), buffer.getLong()};
        };
        return Serdes.serdeFrom(serializer, deserializer);
    }

    // -----------------------------------------------------------------------------------------
    // Knowing when it is done
    // -----------------------------------------------------------------------------------------

    static Set<TopicPartition> inputPartitions(Admin admin, String topic) throws Exception {
        Set<TopicPartition> partitions = new HashSet<>();
        admin.describeTopics(Set.of(topic)).allTopicNames().get().get(topic).partitions()
                .forEach(p -> partitions.add(new TopicPartition(topic, p.partition())));
        return partitions;
    }

    static Map<TopicPartition, Long> endOffsets(Admin admin, Set<TopicPartition> partitions) throws Exception {
        Map<TopicPartition, OffsetSpec> request = new HashMap<>();
        partitions.forEach(tp -> request.put(tp, OffsetSpec.latest()));
        Map<TopicPartition, Long> ends = new HashMap<>();
        admin.listOffsets(request, new ListOffsetsOptions(IsolationLevel.READ_COMMITTED)).all().get()
                .forEach((tp, info) -> ends.put(tp, info.offset()));
        return ends;
    }

    /**
     * Polls the group's committed offsets until every input partition's reached its end and then
     * every partition of the internal (repartition) topics its end at that time; returns when that
     * was seen (epoch ms), or 0 if the application failed or the deadline passed.
     */
    static long waitUntilCommitted(Admin admin, String group, Map<TopicPartition, Long> ends, Set<String> internal,
                                   KafkaStreams streams, CountDownLatch failed, long deadline) throws Exception {
        Set<TopicPartition> internalPartitions = new HashSet<>();
        while (System.currentTimeMillis() < deadline) {
            if (stopped(streams, failed)) {
                return 0;
            }
            Map<TopicPartition, OffsetAndMetadata> committed =
                    admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
            if (!reached(committed, ends)) {
                continue;
            }
            if (internalPartitions.isEmpty()) {
                for (String topic : internal) {
                    internalPartitions.addAll(inputPartitions(admin, topic));
                }
            }
            if (internalPartitions.isEmpty() || reached(committed, endOffsets(admin, internalPartitions))) {
                return System.currentTimeMillis();
            }
        }
        return 0;
    }

    /**
     * Live mode: waits until the runner closes this process's standard input; returns when that was
     * seen (epoch ms), or 0 if the application failed or the deadline passed first.
     */
    static long waitUntilInputCloses(KafkaStreams streams, CountDownLatch failed, long deadline) throws Exception {
        CountDownLatch closed = new CountDownLatch(1);
        Thread watcher = new Thread(() -> {
            try {
                while (System.in.read() >= 0) {
                    // nothing is sent: the input only closes
                }
            } catch (IOException e) {
                // a broken input is a closed one
            }
            closed.countDown();
        }, "stdin-watcher");
        watcher.setDaemon(true);
        watcher.start();
        while (System.currentTimeMillis() < deadline) {
            if (stopped(streams, failed)) {
                return 0;
            }
            if (closed.getCount() == 0) {
                return System.currentTimeMillis();
            }
        }
        return 0;
    }

    /** Waits up to 100 ms for a failure; true if the application failed or stopped. */
    static boolean stopped(KafkaStreams streams, CountDownLatch failed) throws InterruptedException {
        return failed.await(100, TimeUnit.MILLISECONDS) || streams.state() == KafkaStreams.State.ERROR
                || streams.state() == KafkaStreams.State.NOT_RUNNING;
    }

    static boolean reached(Map<TopicPartition, OffsetAndMetadata> committed, Map<TopicPartition, Long> ends) {
        for (Map.Entry<TopicPartition, Long> end : ends.entrySet()) {
            if (end.getValue() == 0) {
                continue;
            }
            OffsetAndMetadata at = committed.get(end.getKey());
            if (at == null || at.offset() < end.getValue()) {
                return false;
            }
        }
        return true;
    }

    // -----------------------------------------------------------------------------------------
    // Arguments
    // -----------------------------------------------------------------------------------------

    static Map<String, String> parseArgs(String[] args) {
        Map<String, String> opts = new HashMap<>();
        for (int i = 0; i < args.length; i++) {
            if (!args[i].startsWith("--") || i + 1 >= args.length) {
                throw new IllegalArgumentException("expected --name value pairs, got " + String.join(" ", args));
            }
            opts.put(args[i].substring(2), args[++i]);
        }
        return opts;
    }

    /** "0:120,1:98" -> {input-0: 120, input-1: 98}: the end offsets the runner took at start. */
    static Map<TopicPartition, Long> parseEnds(String topic, String text) {
        Map<TopicPartition, Long> ends = new HashMap<>();
        for (String item : text.split(",")) {
            String[] parts = item.split(":");
            ends.put(new TopicPartition(topic, Integer.parseInt(parts[0])), Long.parseLong(parts[1]));
        }
        return ends;
    }

    static String required(Map<String, String> opts, String name) {
        String value = opts.get(name);
        if (value == null) {
            throw new IllegalArgumentException("--" + name + " is required");
        }
        return value;
    }

    static Schema readSchema(String path) throws IOException {
        return new Schema.Parser().parse(Files.readString(Path.of(path)));
    }
}
