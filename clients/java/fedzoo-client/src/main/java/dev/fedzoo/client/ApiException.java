package dev.fedzoo.client;

import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;

import org.json.JSONException;
import org.json.JSONObject;

import dev.fedzoo.FedzooException;

/**
 * The server refused a request; {@link #status()}, {@link #code()} and {@link #field()} say why (the server's
 * {@code {"error": {"code", "message", "field"}}} body). {@link #forResponse} picks the subclass of the HTTP
 * status from a table, as {@code fedzoo.clients.errors.error_for_response} does, so callers can catch, say, an
 * {@link Authentication} and register again, or a {@link Conflict} with code {@code duplicate_update}.
 */
public class ApiException extends FedzooException {
    private static final long serialVersionUID = 1L;
    private final int status;
    private final String code;
    private final String serverMessage;
    private final String field;

    /** An error of HTTP {@code status} with the server's code, message and (nullable) field. */
    public ApiException(int status, String code, String message, String field) {
        super(message + " (HTTP " + status + " " + code + (field != null ? ", field '" + field + "'" : "") + ")");
        this.status = status;
        this.code = code;
        this.serverMessage = message;
        this.field = field;
    }

    /** The HTTP status. */
    public int status() {
        return status;
    }

    /** The server's error code, e.g. {@code duplicate_update}, {@code not_selected}, or {@code http_<status>}. */
    public String code() {
        return code;
    }

    /** The server's message alone (without the status and code the exception message adds). */
    public String serverMessage() {
        return serverMessage;
    }

    /** The request field the server blamed, or null. */
    public String field() {
        return field;
    }

    /** 400/422: the request itself is wrong (a field, a body, a format). */
    public static class BadRequest extends ApiException {
        private static final long serialVersionUID = 1L;

        public BadRequest(int status, String code, String message, String field) {
            super(status, code, message, field);
        }
    }

    /** 401: no token, a token the server does not know, or an expired one: register (or rotate) again. */
    public static class Authentication extends ApiException {
        private static final long serialVersionUID = 1L;

        public Authentication(int status, String code, String message, String field) {
            super(status, code, message, field);
        }
    }

    /**
     * 401 {@code token_expired}, {@code token_replaced} or {@code device_revoked}: this device's token will never work
     * again. Register anew with an enrollment token from the fleet's operator
     * ({@link FedzooClient#register(dev.fedzoo.edge.DeviceProfile, String)}).
     */
    public static class ReregistrationRequired extends Authentication {
        private static final long serialVersionUID = 1L;

        public ReregistrationRequired(int status, String code, String message, String field) {
            super(status, code, message, field);
        }

        @Override
        public String getMessage() {
            return super.getMessage() + "; this device must register again with an enrollment token from the fleet's "
                    + "operator: FedzooClient.register(profile, enrollmentToken)";
        }
    }

    /** 403: the token is valid but may not do this (e.g. {@code not_selected} for a round). */
    public static class PermissionDenied extends ApiException {
        private static final long serialVersionUID = 1L;

        public PermissionDenied(int status, String code, String message, String field) {
            super(status, code, message, field);
        }
    }

    /** 404: the model, blob or round does not exist. */
    public static class NotFound extends ApiException {
        private static final long serialVersionUID = 1L;

        public NotFound(int status, String code, String message, String field) {
            super(status, code, message, field);
        }
    }

    /** 409: the request clashes with the server's state (a taken id, a duplicate or stale update, a closed round). */
    public static class Conflict extends ApiException {
        private static final long serialVersionUID = 1L;

        public Conflict(int status, String code, String message, String field) {
            super(status, code, message, field);
        }
    }

    /** 413: the body is larger than the server accepts. */
    public static class PayloadTooLarge extends ApiException {
        private static final long serialVersionUID = 1L;

        public PayloadTooLarge(int status, String code, String message, String field) {
            super(status, code, message, field);
        }
    }

    /** 416: a resumed download asked for bytes past the end of the blob. */
    public static class RangeNotSatisfiable extends ApiException {
        private static final long serialVersionUID = 1L;

        public RangeNotSatisfiable(int status, String code, String message, String field) {
            super(status, code, message, field);
        }
    }

    /** Builds the exception of one status (each subclass's constructor). */
    private interface Factory {
        ApiException create(int status, String code, String message, String field);
    }

    private static final Map<Integer, Factory> BY_STATUS = new HashMap<Integer, Factory>();
    /** 401 codes after which the same token never works again ({@code fedzoo.server.devices.authenticate}). */
    private static final Set<String> REREGISTRATION_CODES = new HashSet<String>(
            Arrays.asList("token_expired", "token_replaced", "device_revoked"));

    static {
        BY_STATUS.put(400, BadRequest::new);
        BY_STATUS.put(401, Authentication::new);
        BY_STATUS.put(403, PermissionDenied::new);
        BY_STATUS.put(404, NotFound::new);
        BY_STATUS.put(409, Conflict::new);
        BY_STATUS.put(413, PayloadTooLarge::new);
        BY_STATUS.put(416, RangeNotSatisfiable::new);
        BY_STATUS.put(422, BadRequest::new);
    }

    /** The exception for an error response, from its status and body (the server's JSON error, or any text). */
    public static ApiException forResponse(int status, String body) {
        String code = "http_" + status;
        String message = body == null || body.isEmpty() ? "HTTP " + status : body.substring(0, Math.min(500, body.length()));
        String field = null;
        try {
            JSONObject error = new JSONObject(body).optJSONObject("error");
            if (error != null) {
                code = error.optString("code", code);
                message = error.optString("message", "");
                field = error.isNull("field") ? null : error.optString("field", null);
            }
        } catch (JSONException | NullPointerException notJson) {
            // a proxy's HTML page or plain text: keep it as the message
        }
        if (status == 401 && REREGISTRATION_CODES.contains(code)) {
            return new ReregistrationRequired(status, code, message, field);
        }
        Factory factory = BY_STATUS.get(status);
        return factory != null ? factory.create(status, code, message, field) : new ApiException(status, code, message, field);
    }
}
