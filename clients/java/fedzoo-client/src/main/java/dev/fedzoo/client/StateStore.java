package dev.fedzoo.client;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;

import org.bouncycastle.crypto.params.Ed25519PublicKeyParameters;
import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

import dev.fedzoo.FedzooException;
import dev.fedzoo.InvalidInputException;
import dev.fedzoo.secagg.SignedRounds;

/**
 * What a device must remember across process death, in one app-private directory (on Android,
 * {@code context.getFilesDir()}), each file replaced atomically (written aside, then renamed):
 * <ul>
 * <li>{@code state.json}: {@code server}, {@code device_id}, {@code token} (as the Python CLI's
 * {@code ~/.config/fedzoo/client.json}), {@code accepted_line_versions} (model line → the newest signed card
 * version accepted, which {@link CardVerifier} refuses to roll back from), {@code accepted_line_cards} (model
 * line → the id of the card accepted at that version: no second card for one line and version) and
 * {@code revocation_list} (the newest operator's {@link RevocationList} verified: the revoked cards that
 * {@link FedzooClient#verifyCard} refuses and the revoked device keys that {@link NeighbourTrust} refuses, under one
 * version), {@code privacy_terms} (the newest operator's {@link PrivacyTerms} verified, which
 * {@link FedzooClient#noisePolicyFor} applies) and {@code secagg_signed_rounds} (the SecAgg+ round ids the device took part in, see
 * {@link #claimSignedRound}), each changed only by a compare-and-swap under an exclusive lock on {@code state.lock}
 * ({@link #change}), so two processes cannot write an older version or list over a newer one;</li>
 * <li>{@code pending/<round>.npz} + {@code pending/<round>.json}: an update trained but not yet confirmed by
 * the server, re-sent by the next participation (a 409 {@code duplicate_update} then counts as delivered).</li>
 * </ul>
 * The directory must be durable app storage, never a cache directory: clearing a cache must not reset what the
 * device accepted. The token is stored in plain app storage; apps that need more wrap it with the Android Keystore.
 */
public final class StateStore {
    static final String ACCEPTED_VERSIONS = "accepted_line_versions";
    static final String ACCEPTED_CARDS = "accepted_line_cards";
    static final String REVOCATION_LIST = "revocation_list";
    static final String PRIVACY_TERMS = "privacy_terms";
    static final String SIGNED_ROUNDS = "secagg_signed_rounds";
    private final File directory;
    private final File pendingDirectory;

    /** A trained update waiting for the server's receipt. */
    public static final class PendingUpdate {
        public final long roundId;
        public final String uploadUrl;
        public final JSONObject metadata;
        public final String deadlineAt;
        public final String encoding;
        public final byte[] delta;

        /** An update for round {@code roundId}: where to send it, its metadata, the round's deadline, encoding and archive. */
        public PendingUpdate(long roundId, String uploadUrl, JSONObject metadata, String deadlineAt, String encoding,
                             byte[] delta) {
            this.roundId = roundId;
            this.uploadUrl = uploadUrl;
            this.metadata = metadata;
            this.deadlineAt = deadlineAt;
            this.encoding = encoding;
            this.delta = delta;
        }
    }

    /** State kept in {@code directory} (created if missing). */
    public StateStore(File directory) {
        this.directory = directory;
        this.pendingDirectory = new File(directory, "pending");
        BlobCache.mkdirs(pendingDirectory);
    }

    /** The directory the state lives in. */
    public File directory() {
        return directory;
    }

    /** The saved state ({@code {}} when nothing was saved yet). */
    public synchronized JSONObject load() {
        File file = new File(directory, "state.json");
        if (!file.isFile()) {
            return new JSONObject();
        }
        try {
            return new JSONObject(new String(BlobCache.readBytes(file), FedzooHttp.UTF8));
        } catch (JSONException error) {
            throw new FedzooException("client state " + file + " is not valid JSON (" + error.getMessage()
                    + "); delete it and register again");
        }
    }

    /** Replaces the saved state atomically. */
    public synchronized void save(JSONObject state) {
        writeAtomically(new File(directory, "state.json"), state.toString().getBytes(FedzooHttp.UTF8));
    }

    /** Sets one key of the saved state and saves it (under {@code state.lock}, as {@link #acceptVersion}). */
    public synchronized void put(String key, Object value) {
        change("store " + key, state -> {
            state.put(key, value);
            return null;
        });
    }

    /** A change to the saved state, made by {@link #change}; it throws to leave the state as it was. */
    private interface Change<T> {
        T apply(JSONObject state) throws JSONException;
    }

    /**
     * Loads the state, applies {@code change} and saves the result, all under this process's lock and an exclusive
     * lock on {@code state.lock} against other processes: the compare-and-swap every kept decision goes through.
     * An exception {@code change} throws leaves the saved state as it was.
     */
    private synchronized <T> T change(String what, Change<T> change) {
        try (RandomAccessFile locked = lockState()) {
            JSONObject state = load();
            T result = change.apply(state);
            save(state);
            return result;
        } catch (IOException error) {
            throw new FedzooException("cannot lock " + new File(directory, "state.lock") + ": " + error.getMessage(), error);
        } catch (JSONException error) {
            throw new FedzooException("cannot " + what + ": " + error.getMessage());
        }
    }

    /** {@code state.lock}, held exclusively against other processes until the returned file is closed. */
    private RandomAccessFile lockState() throws IOException {
        RandomAccessFile handle = new RandomAccessFile(new File(directory, "state.lock"), "rw");
        try {
            handle.getChannel().lock(); // closing the file closes its channel, which releases the lock
            return handle;
        } catch (IOException | RuntimeException error) {
            handle.close();
            throw error;
        }
    }

    /** The newest card version accepted for model line {@code lineId}, or null. */
    public synchronized Integer acceptedVersion(String lineId) {
        return recordedVersion(section(load(), ACCEPTED_VERSIONS), lineId);
    }

    /** The id of the card accepted at the newest version of model line {@code lineId}, or null. */
    public synchronized String acceptedCardId(String lineId) {
        return section(load(), ACCEPTED_CARDS).optString(lineId, null);
    }

    /** As {@link #acceptCard} for a card whose id is not recorded (only the version is kept). */
    public synchronized void acceptVersion(String lineId, int version) {
        acceptCard(lineId, version, null);
    }

    /**
     * Records that card {@code cardId} at {@code version} of model line {@code lineId} was accepted: a
     * compare-and-swap, under this process's lock and an exclusive lock on {@code state.lock} against other
     * processes, that refuses ({@link CardSignatureException}) when a newer version ({@code rollback}) or another
     * card at this version ({@code version_reused}) was accepted meanwhile.
     */
    public synchronized void acceptCard(String lineId, int version, String cardId) {
        change("record version of " + lineId, state -> {
            JSONObject versions = section(state, ACCEPTED_VERSIONS);
            JSONObject cards = section(state, ACCEPTED_CARDS);
            Integer held = recordedVersion(versions, lineId);
            int recorded = held == null ? 0 : held;
            if (version < recorded) {
                throw new CardSignatureException("version " + version + " of line '" + lineId + "' is older than version "
                        + recorded + ", accepted meanwhile (rollback refused)", "rollback");
            }
            String recordedId = version == recorded ? cards.optString(lineId, null) : null;
            if (cardId != null && recordedId != null && !recordedId.equals(cardId)) {
                throw new CardSignatureException("card '" + cardId + "': version " + version + " of line '" + lineId
                        + "' was accepted meanwhile as card '" + recordedId + "'", "version_reused");
            }
            versions.put(lineId, version);
            if (cardId != null) {
                cards.put(lineId, cardId);
            }
            state.put(ACCEPTED_VERSIONS, versions);
            state.put(ACCEPTED_CARDS, cards);
            return null;
        });
    }

    /** The newest revocation list this device verified, or null. */
    public synchronized RevocationList revocationList() {
        JSONObject held = load().optJSONObject(REVOCATION_LIST);
        return held == null ? null : RevocationList.held(held);
    }

    /**
     * Verifies a served revocation list against {@code keys} (the pinned operator keys, by key id) and keeps it when
     * it is newer than the one held: a compare-and-swap under {@code state.lock}; {@link CardSignatureException} for a
     * list none of those keys signed, an older one ({@code rollback}) or another list under the held version
     * ({@code version_reused}).
     */
    public synchronized RevocationList holdRevocationList(Map<String, Ed25519PublicKeyParameters> keys,
            JSONObject document) {
        return change("keep the revocation list", state -> {
            JSONObject held = state.optJSONObject(REVOCATION_LIST);
            RevocationList verified = RevocationList.verify(document, keys, held == null ? null : RevocationList.held(held));
            state.put(REVOCATION_LIST, verified.document());
            return verified;
        });
    }

    /** The newest privacy terms this device verified, or null. */
    public synchronized PrivacyTerms privacyTerms() {
        JSONObject held = load().optJSONObject(PRIVACY_TERMS);
        return held == null ? null : PrivacyTerms.held(held);
    }

    /**
     * Verifies served (or app-bundled) privacy terms against {@code keys} (the pinned operator keys, by key id) and
     * keeps them when newer than the ones held, under {@code state.lock}; {@link CardSignatureException} for terms
     * none of those keys signed, older ones ({@code rollback}) or others under the held version
     * ({@code version_reused}).
     */
    public synchronized PrivacyTerms holdPrivacyTerms(Map<String, Ed25519PublicKeyParameters> keys,
            JSONObject document) {
        return change("keep the privacy terms", state -> {
            JSONObject held = state.optJSONObject(PRIVACY_TERMS);
            PrivacyTerms verified = PrivacyTerms.verify(document, keys, held == null ? null : PrivacyTerms.held(held));
            state.put(PRIVACY_TERMS, verified.document());
            return verified;
        });
    }

    /**
     * The version recorded for {@code lineId} in {@code versions}, or null when none is; a recorded value that is not a
     * whole number of at least 1 (text, null, a fraction, true) is refused: read as "nothing accepted" (or, by
     * {@code optInt}, "9" as 9 and other text as 0) it would turn the rollback check off for that line.
     */
    private Integer recordedVersion(JSONObject versions, String lineId) {
        if (!versions.has(lineId)) {
            return null;
        }
        Object version = versions.opt(lineId);
        if (!(version instanceof Integer) || (Integer) version < 1) {
            Object shown = version instanceof String ? JSONObject.quote((String) version) : version;
            throw new InvalidInputException("client state " + new File(directory, "state.json")
                    + ": the version accepted for line '" + lineId + "' is " + shown + ", not a whole number of at least 1",
                    "state");
        }
        return (Integer) version;
    }

    /**
     * The object under {@code key} (empty when missing); a value there that is not an object is refused, as Python's
     * {@code card_trust._section}: read as empty it would forget every version accepted.
     */
    private JSONObject section(JSONObject state, String key) {
        if (!state.has(key)) {
            return new JSONObject();
        }
        JSONObject section = state.optJSONObject(key);
        if (section == null) {
            throw new InvalidInputException("client state " + new File(directory, "state.json") + ": " + key
                    + " is not a JSON object", "state");
        }
        return section;
    }

    /**
     * Records that this device takes part in SecAgg+ round {@code roundId} of the state's server (as Python's
     * {@code StateFileSignedRounds}): a compare-and-swap under {@code state.lock} that refuses
     * ({@link ProtocolViolation} {@code round_replayed}) a round id recorded before.
     */
    public synchronized void claimSignedRound(String roundId) {
        change("record round " + roundId, state -> {
            String key = SignedRounds.roundKey(state.optString("server", "") + " " + roundId);
            JSONArray taken = state.optJSONArray(SIGNED_ROUNDS);
            if (taken == null) {
                taken = new JSONArray();
                state.put(SIGNED_ROUNDS, taken);
            }
            for (int i = 0; i < taken.length(); i++) {
                if (key.equals(taken.optString(i))) {
                    throw SignedRounds.replayed(roundId);
                }
            }
            taken.put(key);
            return null;
        });
    }

    /** Keeps an update until {@link #removePending} (the delta first, so a half-written pair never looks complete). */
    public synchronized void savePending(PendingUpdate update) {
        writeAtomically(new File(pendingDirectory, update.roundId + ".npz"), update.delta);
        JSONObject description = new JSONObject();
        try {
            description.put("round_id", update.roundId).put("upload_url", update.uploadUrl)
                    .put("metadata", update.metadata).put("deadline_at", update.deadlineAt).put("encoding", update.encoding);
        } catch (JSONException error) {
            throw new FedzooException("cannot describe the pending update: " + error.getMessage());
        }
        writeAtomically(new File(pendingDirectory, update.roundId + ".json"), description.toString().getBytes(FedzooHttp.UTF8));
    }

    /** Every complete pending update, oldest round first. */
    public synchronized List<PendingUpdate> pending() {
        List<PendingUpdate> updates = new ArrayList<PendingUpdate>();
        String[] names = pendingDirectory.list();
        if (names == null) {
            return updates;
        }
        Arrays.sort(names);
        for (String name : names) {
            if (!name.endsWith(".json")) {
                continue;
            }
            File delta = new File(pendingDirectory, name.replace(".json", ".npz"));
            if (!delta.isFile()) {
                continue;
            }
            try {
                JSONObject description = new JSONObject(new String(BlobCache.readBytes(new File(pendingDirectory, name)), FedzooHttp.UTF8));
                updates.add(new PendingUpdate(description.getLong("round_id"), description.getString("upload_url"),
                        description.getJSONObject("metadata"), description.getString("deadline_at"),
                        description.getString("encoding"), BlobCache.readBytes(delta)));
            } catch (JSONException corrupt) {
                removePending(Long.parseLong(name.replace(".json", "")));
            }
        }
        return updates;
    }

    /** Forgets round {@code roundId}'s pending update (the server decided on it). */
    public synchronized void removePending(long roundId) {
        BlobCache.deleteQuietly(new File(pendingDirectory, roundId + ".json"));
        BlobCache.deleteQuietly(new File(pendingDirectory, roundId + ".npz"));
    }

    /** Writes {@code data} to a temporary file beside {@code target}, syncs it, then renames it over the target. */
    static void writeAtomically(File target, byte[] data) {
        File temporary = new File(target.getParentFile(), "." + target.getName() + ".tmp");
        try {
            FileOutputStream out = new FileOutputStream(temporary);
            try {
                out.write(data);
                out.getFD().sync();
            } finally {
                out.close();
            }
        } catch (IOException error) {
            throw new FedzooException("cannot write " + target + ": " + error.getMessage(), error);
        }
        if (!temporary.renameTo(target)) {
            throw new FedzooException("cannot replace " + target);
        }
    }
}
