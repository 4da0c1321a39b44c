import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.common.TopicPartition;

/**
 * Moves partitions' replicas with Kafka's Admin API (alterPartitionReassignments, which
 * librdkafka lacks) and waits until the reassignment is complete. A single-file program
 * that java runs from source with the broker's jars (tests/support/failover.py):
 *
 *   java -cp 'KAFKA_LIB/*' Reassign.java BOOTSTRAP TOPIC P=R,R,R [P=R,R ...]
 */
public class Reassign {
    public static void main(String[] args) throws Exception {
        Properties config = new Properties();
        config.put("bootstrap.servers", args[0]);
        try (Admin admin = Admin.create(config)) {
            Map<TopicPartition, Optional<NewPartitionReassignment>> moves = new java.util.HashMap<>();
            for (int i = 2; i < args.length; i++) {
                String[] move = args[i].split("=");
                List<Integer> replicas = new ArrayList<>();
                for (String replica : move[1].split(",")) {
                    replicas.add(Integer.parseInt(replica));
                }
                moves.put(new TopicPartition(args[1], Integer.parseInt(move[0])),
                          Optional.of(new NewPartitionReassignment(replicas)));
            }
            admin.alterPartitionReassignments(moves).all().get();
            Set<TopicPartition> moving = moves.keySet();
            while (!admin.listPartitionReassignments(moving).reassignments().get().isEmpty()) {
                Thread.sleep(200);
            }
        }
    }
}
