// Makes one broker the leader of one partition: its replicas are reordered so that broker comes
// first, and a preferred-leader election follows. The fault suite runs it (java
// PreferredLeader.java, with Kafka's jars on the class path) to put a consumer group's
// coordinator on a chosen node, since librdkafka's admin API has no partition reassignment.
// Arguments: bootstrap servers, topic, partition, broker id.
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.errors.ElectionNotNeededException;

public class PreferredLeader {
    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: PreferredLeader <bootstrap> <topic> <partition> <broker id>");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        TopicPartition tp = new TopicPartition(args[1], Integer.parseInt(args[2]));
        int broker = Integer.parseInt(args[3]);
        try (Admin admin = Admin.create(props)) {
            List<Integer> order = new ArrayList<>(List.of(broker));
            for (Node node : describe(admin, tp).replicas()) {
                if (node.id() != broker) {
                    order.add(node.id());
                }
            }
            if (order.size() == 1) {
                throw new IllegalStateException("broker " + broker + " holds no replica of " + tp);
            }
            admin.alterPartitionReassignments(Map.of(tp, Optional.of(new NewPartitionReassignment(order))))
                .all().get();
            long deadline = System.currentTimeMillis() + 60_000;
            while (!admin.listPartitionReassignments(Set.of(tp)).reassignments().get().isEmpty()) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("the reordering of " + tp + " did not finish in 60 s");
                }
                Thread.sleep(100);
            }
            Optional<Throwable> failed =
                admin.electLeaders(ElectionType.PREFERRED, Set.of(tp)).partitions().get().get(tp);
            if (failed.isPresent() && !(failed.get() instanceof ElectionNotNeededException)) {
                throw new IllegalStateException("no preferred-leader election for " + tp, failed.get());
            }
            System.out.println(tp + ": replicas " + order + ", preferred leader elected");
        }
    }

    private static TopicPartitionInfo describe(Admin admin, TopicPartition tp)
            throws Exception {
        TopicDescription topic = admin.describeTopics(Set.of(tp.topic())).allTopicNames().get().get(tp.topic());
        return topic.partitions().get(tp.partition());
    }
}
