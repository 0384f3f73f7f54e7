// The Java half of bench/java_client.py's SecAgg+ part (compiled by it, run as java -cp <classes and SDK classpath>
// JavaSecAggStages RUNS CLIENTS NEIGHBOURS LENGTH): a whole round of CLIENTS devices in this process, each run a
// fresh round; the time of device 0's work in each stage (the SDK's SecAggClient and the REST framing of its reply,
// no HTTP), then the process's peak RSS (VmHWM):
//   -> {"stage_ms": {"advertise_keys": [...], ...}, "peak_rss_mb": ...}

import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;

import org.bouncycastle.crypto.params.Ed25519PrivateKeyParameters;
import org.bouncycastle.util.encoders.Base64;
import org.json.JSONArray;
import org.json.JSONObject;

import dev.fedzoo.secagg.Framing;
import dev.fedzoo.secagg.Graph;
import dev.fedzoo.secagg.SecAggBounds;
import dev.fedzoo.secagg.SecAggClient;
import dev.fedzoo.secagg.SecAggConfig;
import dev.fedzoo.secagg.Signatures;

public class JavaSecAggStages {
    static final String[] STAGES = {"advertise_keys", "share_keys", "masked_input", "consistency_check", "unmask"};

    public static void main(String[] args) throws Exception {
        int runs = Integer.parseInt(args[0]);
        int n = Integer.parseInt(args[1]);
        int k = Integer.parseInt(args[2]);
        int length = Integer.parseInt(args[3]);
        Map<String, List<Double>> times = new LinkedHashMap<String, List<Double>>();
        for (String stage : STAGES) {
            times.put(stage, new ArrayList<Double>());
        }
        for (int run = 0; run < runs; run++) {
            int corrupt = new SecAggBounds().corruptDevices(n);
            int t = SecAggBounds.thresholdFloor(k, corrupt);
            round(new SecAggConfig("bench-" + run, n, k, t, length, 0.05, 127, Math.max(Math.max(3, t), corrupt + 2)),
                    times);
        }
        long peakKb = 0;
        for (String line : Files.readAllLines(Paths.get("/proc/self/status"))) {
            if (line.startsWith("VmHWM:")) {
                peakKb = Long.parseLong(line.replaceAll("\\D", ""));
            }
        }
        System.out.println(new JSONObject().put("stage_ms", new JSONObject(times)).put("peak_rss_mb", peakKb / 1024.0));
    }

    /** One round; device 0's time per stage is added to {@code times}, the others' work is the round around it. */
    static void round(SecAggConfig config, Map<String, List<Double>> times) throws Exception {
        int n = config.numClients;
        SecAggClient[] clients = new SecAggClient[n];
        byte[][] signing = new byte[n][];
        JSONObject[] adverts = new JSONObject[n];
        for (int c = n - 1; c >= 0; c--) { // device 0 last in every stage: the others' work warms nothing of its own
            Ed25519PrivateKeyParameters key = Signatures.newSigningKey();
            signing[c] = Signatures.publicBytes(key);
            long start = System.nanoTime();
            clients[c] = new SecAggClient(config, c, key, new SecAggBounds(), null);
            adverts[c] = clients[c].advertiseKeys();
            record(times, c, "advertise_keys", start);
        }
        java.util.TreeMap<Integer, byte[]> nonces = new java.util.TreeMap<Integer, byte[]>();
        for (int c = 0; c < n; c++) {
            nonces.put(c, Base64.decode(adverts[c].getString("nonce")));
        }
        byte[] seed = Graph.graphSeed(config, nonces);
        String advertised = Base64.toBase64String(Graph.advertisedBytes(nonces));
        List<List<JSONObject>> inbox = new ArrayList<List<JSONObject>>();
        for (int c = 0; c < n; c++) {
            inbox.add(new ArrayList<JSONObject>());
        }
        for (int c = n - 1; c >= 0; c--) {
            JSONArray keys = new JSONArray();
            for (int peer : Graph.neighbours(config, seed, c)) {
                keys.put(new JSONObject().put("client", peer).put("cipher_public_key", adverts[peer].get("cipher_public_key"))
                        .put("mask_public_key", adverts[peer].get("mask_public_key"))
                        .put("signing_public_key", Base64.toBase64String(signing[peer]))
                        .put("signature", adverts[peer].get("signature")));
            }
            JSONObject request = new JSONObject().put("stage", "share_keys").put("advertised", advertised)
                    .put("public_keys", keys);
            long start = System.nanoTime();
            JSONObject reply = clients[c].shareKeys(request);
            Framing.encodeShareKeys(reply);
            record(times, c, "share_keys", start);
            JSONArray shares = reply.getJSONArray("shares");
            for (int i = 0; i < shares.length(); i++) {
                JSONObject share = shares.getJSONObject(i);
                inbox.get(share.getInt("holder")).add(new JSONObject().put("owner", c).put("ciphertext", share.get("ciphertext")));
            }
        }
        Random random = new Random(1);
        JSONArray survivors = new JSONArray();
        for (int c = 0; c < n; c++) {
            survivors.put(c);
        }
        String[] signatures = new String[n];
        for (int c = n - 1; c >= 0; c--) {
            int[] ring = new int[config.vectorLength + 1];
            for (int i = 0; i < ring.length; i++) {
                ring[i] = random.nextInt(1 << 16);
            }
            JSONObject request = new JSONObject().put("stage", "masked_input").put("encrypted_shares", new JSONArray(inbox.get(c)));
            long start = System.nanoTime();
            clients[c].maskedInput(request, ring);
            record(times, c, "masked_input", start);
        }
        for (int c = n - 1; c >= 0; c--) {
            JSONObject request = new JSONObject().put("stage", "consistency_check").put("survivors", survivors);
            long start = System.nanoTime();
            signatures[c] = clients[c].consistencyCheck(request).getString("signature");
            record(times, c, "consistency_check", start);
        }
        JSONArray signed = new JSONArray();
        for (int peer : Graph.neighbours(config, seed, 0)) {
            signed.put(new JSONObject().put("client", peer).put("signature", signatures[peer]));
        }
        JSONObject request = new JSONObject().put("stage", "unmask").put("survivors", survivors).put("signatures", signed);
        long start = System.nanoTime();
        Framing.encodeUnmask(clients[0].unmask(request));
        record(times, 0, "unmask", start);
    }

    static void record(Map<String, List<Double>> times, int client, String stage, long startNs) {
        if (client == 0) {
            times.get(stage).add((System.nanoTime() - startNs) / 1e6);
        }
    }
}
