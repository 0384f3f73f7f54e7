package dev.fedzoo;

import java.io.File;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;

import org.json.JSONException;
import org.json.JSONObject;

import dev.fedzoo.client.BlobCache;
import dev.fedzoo.client.FedzooClient;
import dev.fedzoo.client.StateStore;
import dev.fedzoo.codec.Npy;
import dev.fedzoo.codec.Npz;
import dev.fedzoo.codec.UpdateCodec;
import dev.fedzoo.edge.DeviceProfile;
import dev.fedzoo.edge.EdgeSession;
import dev.fedzoo.edge.FloatTensor;
import dev.fedzoo.fl.LocalData;
import dev.fedzoo.fl.Participation;
import dev.fedzoo.fl.ParticipationResult;
import dev.fedzoo.secagg.DeviceCertificates;

/**
 * The device side from a shell on the JVM, as Python's {@code fedzoo client}: the server URL and token live in a
 * {@link StateStore} directory after {@code register}. Each command prints one JSON object per result.
 *
 * <pre>
 * java -cp ... dev.fedzoo.Cli register --state DIR --server URL --device-id ID [--enrollment-token T]
 * java -cp ... dev.fedzoo.Cli run --state DIR --task mnist --latency-budget-ms 5 --inputs test.npz
 * java -cp ... dev.fedzoo.Cli participate --state DIR --task mnist --data shard.npz [--encoding int8] [--rounds 1] [--max-idle-s 300]
 *     [--operator-keys operator-keys.json]
 * </pre>
 *
 * {@code --operator-keys} pins the operator's key set for SecAgg+ neighbours' certificates; without it the device
 * declines SecAgg+ rounds ({@code operator_keys_required}).
 */
public final class Cli {
    private Cli() {
    }

    /** Runs one command: {@code register}, {@code run} or {@code participate} (see the class comment). */
    public static void main(String[] arguments) throws Exception {
        if (arguments.length == 0) {
            throw new InvalidInputException("usage: Cli register|run|participate --state DIR ... (see the class javadoc)");
        }
        Map<String, String> options = new HashMap<String, String>();
        for (int i = 1; i + 1 < arguments.length; i += 2) {
            options.put(arguments[i].replaceFirst("^--", ""), arguments[i + 1]);
        }
        StateStore state = new StateStore(new File(required(options, "state")));
        String command = arguments[0];
        if (command.equals("register")) {
            FedzooClient client = new FedzooClient(required(options, "server"), null, new File(state.directory(), "cache"))
                    .keepStateIn(state);
            JSONObject registration = client.register(DeviceProfile.collect(required(options, "device-id"), 1,
                    options.get("device-class"), null), options.get("enrollment-token"));
            System.out.println(new JSONObject().put("registered", registration.getString("device_id")));
        } else if (command.equals("run")) {
            FedzooClient client = client(state);
            JSONObject choice = client.lookup(required(options, "task"), Double.parseDouble(required(options, "latency-budget-ms")),
                    null, null);
            ModelCard card = new ModelCard(choice.getJSONObject("model"));
            LocalData data = read(new File(required(options, "inputs")));
            EdgeSession session = client.session(card, 1);
            double accuracy = EdgeSession.accuracy(session.predict(data.x), data.y);
            session.close();
            System.out.println(new JSONObject().put("model_id", card.id()).put("accuracy", accuracy).put("examples", data.size()));
        } else if (command.equals("participate")) {
            FedzooClient client = client(state);
            if (options.containsKey("operator-keys")) {
                client.requireCertifiedNeighbours(DeviceCertificates.fromJson(new JSONObject(new String(
                        BlobCache.readBytes(new File(options.get("operator-keys"))), "UTF-8"))));
            }
            participate(client, state, options);
        } else {
            throw new InvalidInputException("unknown command '" + command + "'; use register, run or participate", "command");
        }
    }

    private static void participate(FedzooClient client, StateStore state, Map<String, String> options) throws JSONException,
            InterruptedException {
        LocalData data = read(new File(required(options, "data")));
        UpdateCodec.Encoding encoding = UpdateCodec.Encoding.fromWireName(options.containsKey("encoding")
                ? options.get("encoding") : "fp32");
        int rounds = Integer.parseInt(options.containsKey("rounds") ? options.get("rounds") : "1");
        long maxIdleMs = (long) (1000 * Double.parseDouble(options.containsKey("max-idle-s") ? options.get("max-idle-s") : "300"));
        Participation participation = new Participation(client, state);
        Random random = new Random();
        List<ParticipationResult> results = new ArrayList<ParticipationResult>();
        long idleSince = System.currentTimeMillis();
        while (results.size() < rounds && System.currentTimeMillis() - idleSince < maxIdleMs) {
            ParticipationResult result = participation.participateOnce(required(options, "task"), data, encoding,
                    options.get("family"), null);
            if (result.roundId == null) {
                Thread.sleep(result.nextCheckInMs(random));
                continue;
            }
            results.add(result);
            idleSince = System.currentTimeMillis();
            System.out.println(new JSONObject().put("round_id", result.roundId).put("outcome", result.outcome)
                    .put("upload_bytes", result.uploadBytes).put("metrics", new JSONObject(result.metrics)));
        }
        if (results.isEmpty()) {
            System.out.println(new JSONObject().put("outcome", "no task").put("max_idle_s", maxIdleMs / 1000.0));
        }
    }

    private static FedzooClient client(StateStore state) {
        JSONObject saved = state.load();
        if (!saved.has("server") || !saved.has("token")) {
            throw new InvalidInputException("no server and token in " + state.directory() + ": register first", "state");
        }
        return new FedzooClient(saved.optString("server"), null, new File(state.directory(), "cache")).keepStateIn(state);
    }

    /** {@code x} (N, C, H, W) float32 in [0, 1] and {@code y} int64 labels from an {@code .npz}. */
    static LocalData read(File file) {
        Map<String, Npy.Array> arrays = Npz.read(BlobCache.readBytes(file));
        if (!arrays.containsKey("x") || !arrays.containsKey("y")) {
            throw new InvalidInputException(file + " must hold 'x' and 'y'; it holds " + arrays.keySet(), "data");
        }
        return new LocalData(new FloatTensor(arrays.get("x").shape, arrays.get("x").floats()), arrays.get("y").longs());
    }

    private static String required(Map<String, String> options, String name) {
        String value = options.get(name);
        if (value == null) {
            throw new InvalidInputException("--" + name + " is required", name);
        }
        return value;
    }
}
