package dev.fedzoo.client;

import java.io.File;
import java.util.Collections;

import org.json.JSONObject;

/**
 * A client that can also act as the operator, as {@code fedzoo.admin.operator_client.OperatorClient}: the device SDK's
 * calls plus the ones that take the admin token. They live here, not in {@link FedzooClient}: a device never holds
 * the admin token, so the device SDK has no admin calls.
 *
 * <pre>{@code
 * OperatorClient operator = new OperatorClient("https://models.example", null, new File("/tmp/fedzoo-admin"));
 * long roundId = operator.createRounds(config, adminToken).getLong("id");
 * }</pre>
 */
public final class OperatorClient extends FedzooClient {
    /** A client of {@code baseUrl} with a token for its other calls (null for none) and a blob cache directory. */
    public OperatorClient(String baseUrl, String token, File cacheDir) {
        super(baseUrl, token, cacheDir);
    }

    /** Starts a plan of rounds ({@code POST /v1/fl/rounds}). */
    public JSONObject createRounds(JSONObject config, String adminToken) {
        return http().request("POST", "/v1/fl/rounds", config.toString().getBytes(FedzooHttp.UTF8), "application/json",
                Collections.singletonMap("Authorization", "Bearer " + adminToken), FedzooHttp.Resend.UNSAFE, 201).json();
    }
}
