package dev.fedzoo.secagg;

import java.math.BigInteger;
import java.security.SecureRandom;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.function.BiConsumer;
import java.util.function.ObjIntConsumer;
import java.util.function.Supplier;
import java.util.stream.IntStream;

import org.bouncycastle.crypto.params.Ed25519PrivateKeyParameters;
import org.bouncycastle.crypto.params.X25519PrivateKeyParameters;
import org.bouncycastle.util.encoders.Base64;
import org.json.JSONArray;
import org.json.JSONObject;

/**
 * One device in one SecAgg+ round (protocol v3), stage for stage as {@code fedzoo.secagg.client.SecAggClient}:
 *
 * <ol>
 * <li>{@link #advertiseKeys}: two fresh X25519 public keys and a fresh nonce, signed with the device's long-term
 * Ed25519 key, once the round id is claimed ({@link SignedRounds}: never twice);</li>
 * <li>{@link #shareKeys}: once the graph is the one every advertised nonce (its own included) fixes and every
 * neighbour's keys carry its signature, Shamir shares of a fresh self-mask seed
 * and of the mask key, each pair encrypted to its holder, with commitments;</li>
 * <li>{@link #maskedInput}: the ring input plus the self-mask and one pairwise mask per neighbour that shared;</li>
 * <li>{@link #consistencyCheck}: the device signs the survivor set it is shown, with its own stage-1 keys, nonce and
 * the graph seed;</li>
 * <li>{@link #unmask}: under at least t neighbours' signatures on that same set, for each neighbour that shared its
 * self-mask share (it survived) or its mask-key share (it did not), never both.</li>
 * </ol>
 *
 * Every refusal is a {@link ProtocolViolation} with the reason Python gives. The round's secrets live in this
 * object only and are dropped after {@code unmask}.
 */
public final class SecAggClient {
    public static final String SELF_MASK = "self_mask";
    public static final String MASK_KEY = "mask_key";
    static final int SHARE_COMMITMENT_BYTES = 16;
    private static final SecureRandom RANDOM = new SecureRandom();

    private final SecAggConfig config;
    private final int client;
    private final byte[] context;
    private final byte[] configDigest;
    private final Set<Integer> neighbours = new HashSet<Integer>();
    private final Ed25519PrivateKeyParameters signingKey;
    private final Set<String> trustedSigningKeys;
    private final SignedRounds signedRounds;
    private final DeviceCertificates certificates;
    private final Map<String, Integer> neighbourDevices = new HashMap<String, Integer>();
    private String stage = "advertise_keys";
    private byte[] cipherPublic;
    private byte[] maskPublic;
    private byte[] nonce;
    private byte[] graphSeed;
    private TreeMap<Integer, byte[]> nonces = new TreeMap<Integer, byte[]>();
    private X25519PrivateKeyParameters cipherPrivate;
    private X25519PrivateKeyParameters maskPrivate;
    private byte[] seed;
    private final Map<Integer, byte[]> cipherPublicKeys = new HashMap<Integer, byte[]>();
    private final Map<Integer, byte[]> maskPublicKeys = new HashMap<Integer, byte[]>();
    private final Map<Integer, byte[]> signingPublicKeys = new HashMap<Integer, byte[]>();
    private final Map<Integer, byte[]> shareEncryptionKeys = new HashMap<Integer, byte[]>();
    private Map<Integer, byte[]> received = new TreeMap<Integer, byte[]>();
    private Set<Integer> survivors;

    /**
     * Client {@code client} of a round; {@code bounds} are the device's own limits on the configuration;
     * {@code trustedSigningKeys} (base64, may be null) the enrolled devices' keys when the operator pins them;
     * {@code signedRounds} the device's memory of the round ids it took part in.
     */
    public SecAggClient(SecAggConfig config, int client, Ed25519PrivateKeyParameters signingKey, SecAggBounds bounds,
                        Set<String> trustedSigningKeys, SignedRounds signedRounds) {
        this(config, client, signingKey, bounds, trustedSigningKeys, signedRounds, null);
    }

    /**
     * As above; with {@code certificates} (may be null) a neighbour's key counts only with the operator's certificate
     * for the device the server names, one seat per device ({@link DeviceCertificates}).
     */
    public SecAggClient(SecAggConfig config, int client, Ed25519PrivateKeyParameters signingKey, SecAggBounds bounds,
                        Set<String> trustedSigningKeys, SignedRounds signedRounds, DeviceCertificates certificates) {
        if (client < 0 || client >= config.numClients) {
            throw new ProtocolViolation("client number " + client + " is outside [0, " + config.numClients + ")",
                    "malformed");
        }
        bounds.check(config);
        this.config = config;
        this.client = client;
        this.context = config.context();
        this.configDigest = config.digest();
        this.signingKey = signingKey;
        this.trustedSigningKeys = trustedSigningKeys;
        this.signedRounds = signedRounds;
        this.certificates = certificates;
    }

    /** A client that remembers the round ids it took part in for its own lifetime only. */
    public SecAggClient(SecAggConfig config, int client, Ed25519PrivateKeyParameters signingKey, SecAggBounds bounds,
                        Set<String> trustedSigningKeys) {
        this(config, client, signingKey, bounds, trustedSigningKeys, new SignedRounds());
    }

    /** The round's configuration. */
    public SecAggConfig config() {
        return config;
    }

    private void enter(String expected, JSONObject request) {
        if (!stage.equals(expected)) {
            throw new ProtocolViolation("the server asked for '" + expected + "' while this client expects '" + stage + "'",
                    "wrong_stage");
        }
        if (request != null && !expected.equals(request.optString("stage"))) {
            throw new ProtocolViolation("expected a '" + expected + "' message, got '" + request.optString("stage") + "'",
                    "wrong_stage");
        }
    }

    /** Stage 1: fresh public keys and nonce for this round, signed with the device's long-term key. */
    public JSONObject advertiseKeys() {
        enter("advertise_keys", null);
        signedRounds.claim(config.roundId);
        cipherPrivate = Crypto.newKeyPair();
        maskPrivate = Crypto.newKeyPair();
        cipherPublic = Crypto.publicBytes(cipherPrivate);
        maskPublic = Crypto.publicBytes(maskPrivate);
        nonce = new byte[Signatures.NONCE_BYTES];
        RANDOM.nextBytes(nonce);
        byte[] signature = Signatures.sign(signingKey,
                Signatures.advertisePayload(config, configDigest, client, cipherPublic, maskPublic, nonce));
        stage = "share_keys";
        return reply("advertise_keys").with("cipher_public_key", Base64.toBase64String(cipherPublic))
                .with("mask_public_key", Base64.toBase64String(maskPublic))
                .with("nonce", Base64.toBase64String(nonce))
                .with("signature", Base64.toBase64String(signature));
    }

    /** Stage 2: shares of the self-mask seed and the mask key for each neighbour whose keys carry its signature. */
    public JSONObject shareKeys(JSONObject request) {
        enter("share_keys", request);
        joinGraph(request);
        JSONObject[] entries = listedEntries(request, "public_keys");
        int[] peers = ids(entries, "client");
        Set<Integer> advertisedNeighbours = new TreeSet<Integer>(neighbours);
        advertisedNeighbours.retainAll(nonces.keySet());
        Set<Integer> sent = new TreeSet<Integer>();
        for (int peer : peers) {
            sent.add(peer);
        }
        if (!sent.equals(advertisedNeighbours)) {
            throw new ProtocolViolation("the server sent keys of clients " + sent + ", but this client's advertised "
                    + "neighbours are " + advertisedNeighbours, "malformed");
        }
        Set<String> distinctSigningKeys = new HashSet<String>();
        for (int i = 0; i < peers.length; i++) {
            cipherPublicKeys.put(peers[i], exchangeKey(entries[i], "cipher_public_key"));
            maskPublicKeys.put(peers[i], exchangeKey(entries[i], "mask_public_key"));
            byte[] signingPublic = neighbourSigningKey(peers[i], entries[i]);
            signingPublicKeys.put(peers[i], signingPublic);
            distinctSigningKeys.add(Base64.toBase64String(signingPublic));
        }
        if (distinctSigningKeys.size() != peers.length) {
            throw new ProtocolViolation("the server relayed one signing key for two neighbours", "bad_signature");
        }
        if (peers.length < config.threshold) {
            throw new ProtocolViolation("only " + peers.length + " neighbours have keys; sharing needs " + config.threshold,
                    "too_few_neighbours");
        }
        seed = new byte[32];
        RANDOM.nextBytes(seed);
        int[] holders = peers.clone();
        Arrays.sort(holders);
        int[] xs = new int[holders.length];
        for (int i = 0; i < holders.length; i++) {
            xs[i] = holders[i] + 1;
        }
        BigInteger[] seedShares = Shamir.split(seed, config.threshold, xs);
        BigInteger[] keyShares = Shamir.split(maskPrivate.getEncoded(), config.threshold, xs);
        JSONArray shares = new JSONArray();
        for (int i = 0; i < holders.length; i++) {
            int holder = holders[i];
            byte[] key = Crypto.agree(cipherPrivate, cipherPublicKeys.get(holder), "share-encryption", context);
            shareEncryptionKeys.put(holder, key); // the same key opens the shares this neighbour sends back
            byte[] seedValue = Shamir.valueBytes(seedShares[i]);
            byte[] keyValue = Shamir.valueBytes(keyShares[i]);
            byte[] ciphertext = Crypto.encrypt(key, Graph.concat(SecAggConfig.u32(client), SecAggConfig.u32(holder),
                    seedValue, keyValue), shareAssociatedData(config, client, holder));
            shares.put(new Json().with("holder", holder).with("ciphertext", Base64.toBase64String(ciphertext))
                    .with("self_mask_commitment", shareCommitment(config, SELF_MASK, client, holder, seedValue))
                    .with("mask_key_commitment", shareCommitment(config, MASK_KEY, client, holder, keyValue)));
        }
        stage = "masked_input";
        return reply("share_keys").with("shares", shares).with("self_mask_seed_commitment",
                Crypto.commitment(32, context, "self_mask_seed".getBytes(SecAggConfig.UTF8), SecAggConfig.u32(client), seed));
    }

    /** Stage 3: the masked vector as the REST endpoint takes it (little-endian ring values, 2 or 4 bytes each). */
    public byte[] maskedInput(JSONObject request, int[] ringVector) {
        enter("masked_input", request);
        JSONObject[] entries = listedEntries(request, "encrypted_shares");
        int[] senders = ids(entries, "owner");
        for (int sender : senders) {
            if (!maskPublicKeys.containsKey(sender)) {
                throw new ProtocolViolation("the server forwarded shares from clients whose keys this client never got",
                        "malformed");
            }
        }
        if (senders.length < config.threshold) {
            throw new ProtocolViolation("only " + senders.length + " neighbours shared their keys; masking needs "
                    + config.threshold, "too_few_neighbours");
        }
        if (ringVector.length != config.vectorLength + 1) {
            throw new ProtocolViolation("the input must have " + (config.vectorLength + 1) + " ring values, got "
                    + ringVector.length, "malformed");
        }
        received = new TreeMap<Integer, byte[]>();
        for (int i = 0; i < senders.length; i++) {
            received.put(senders[i], base64(entries[i], "ciphertext"));
        }
        int length = config.vectorLength + 1;
        int bits = config.modulusBits();
        int[] masked = ringVector.clone();
        Crypto.addMask(masked, Crypto.deriveKey(seed, "self-mask", context), 1, bits);
        addInto(masked, pairwiseMasks(senders, length, bits));
        stage = "consistency_check";
        int width = bits / 8;
        byte[] out = new byte[length * width];
        for (int i = 0, at = 0; i < length; i++, at += width) {
            out[at] = (byte) masked[i];
            out[at + 1] = (byte) (masked[i] >>> 8);
            if (width == 4) {
                out[at + 2] = (byte) (masked[i] >>> 16);
                out[at + 3] = (byte) (masked[i] >>> 24);
            }
        }
        return out;
    }

    /**
     * The sum of the pairwise masks with {@code peers}, each added or subtracted by id order. One key agreement and one
     * keystream per peer, independent of the others: they run on all the device's cores, each thread summing into a
     * vector of its own, and the vectors are added (the ring wraps, so the order of the additions does not matter).
     */
    private int[] pairwiseMasks(final int[] peers, final int length, final int bits) {
        return IntStream.range(0, peers.length).parallel().collect(new Supplier<int[]>() {
            @Override
            public int[] get() {
                return new int[length];
            }
        }, new ObjIntConsumer<int[]>() {
            @Override
            public void accept(int[] sum, int i) {
                byte[] key = Crypto.agree(maskPrivate, maskPublicKeys.get(peers[i]), "pairwise-mask", context);
                Crypto.addMask(sum, key, client < peers[i] ? 1 : -1, bits); // wraps modulo 2^bits
            }
        }, new BiConsumer<int[], int[]>() {
            @Override
            public void accept(int[] sum, int[] other) {
                addInto(sum, other);
            }
        });
    }

    private static void addInto(int[] sum, int[] other) {
        for (int i = 0; i < sum.length; i++) {
            sum[i] += other[i];
        }
    }

    /** Stage 4: signs the survivor set the server shows this client; unmasking later happens for this set only. */
    public JSONObject consistencyCheck(JSONObject request) {
        enter("consistency_check", request);
        Set<Integer> shown = clientIds(request.opt("survivors"), "survivors");
        checkSurvivors(shown);
        survivors = shown;
        byte[] signature = Signatures.sign(signingKey, Signatures.consistencyPayload(config, configDigest, client,
                cipherPublic, maskPublic, nonce, graphSeed, sorted(shown)));
        stage = "unmask";
        return reply("consistency_check").with("signature", Base64.toBase64String(signature));
    }

    /** Stage 5: the shares of the neighbours that shared, under t neighbours' signatures on the set signed in stage 4. */
    public JSONObject unmask(JSONObject request) {
        enter("unmask", request);
        Set<Integer> shown = clientIds(request.opt("survivors"), "survivors");
        if (!shown.equals(survivors)) {
            throw new ProtocolViolation("the server asks this client to unmask for another survivor set than the one it "
                    + "signed", "inconsistent_survivors");
        }
        checkSurvivors(shown);
        JSONObject[] entries = listedEntries(request, "signatures");
        int[] signers = ids(entries, "client");
        for (int signer : signers) {
            if (!neighbours.contains(signer)) {
                throw new ProtocolViolation("the server sent a signature of client " + signer
                        + ", not this client's neighbour", "malformed");
            }
        }
        for (int i = 0; i < signers.length; i++) {
            byte[] signingPublic = signingPublicKeys.get(signers[i]);
            byte[] signature = base64(entries[i], "signature");
            if (signingPublic == null || !Signatures.verify(signingPublic, signature, Signatures.consistencyPayload(
                    config, configDigest, signers[i], cipherPublicKeys.get(signers[i]), maskPublicKeys.get(signers[i]),
                    nonces.get(signers[i]), graphSeed, sorted(shown)))) {
                throw new ProtocolViolation("client " + signers[i] + "'s signature on the survivor set does not verify",
                        "bad_signature");
            }
        }
        if (signers.length < config.threshold) {
            throw new ProtocolViolation("only " + signers.length + " neighbours signed this survivor set; this client "
                    + "reveals shares under " + config.threshold, "too_few_signatures");
        }
        JSONArray shares = new JSONArray();
        JSONArray undecryptable = new JSONArray();
        for (Map.Entry<Integer, byte[]> entry : received.entrySet()) {
            int owner = entry.getKey();
            byte[] key = shareEncryptionKeys.get(owner);
            byte[] plaintext = Crypto.decrypt(key, entry.getValue(), shareAssociatedData(config, owner, client));
            byte[] header = Graph.concat(SecAggConfig.u32(owner), SecAggConfig.u32(client));
            if (plaintext == null || plaintext.length != 8 + 2 * Shamir.SHARE_BYTES
                    || !Arrays.equals(Arrays.copyOf(plaintext, 8), header)) {
                undecryptable.put(owner);
                continue;
            }
            boolean survived = shown.contains(owner);
            int from = survived ? 8 : 8 + Shamir.SHARE_BYTES;
            shares.put(new Json().with("owner", owner).with("kind", survived ? SELF_MASK : MASK_KEY)
                    .with("value", Base64.toBase64String(Arrays.copyOfRange(plaintext, from, from + Shamir.SHARE_BYTES))));
        }
        stage = "done";
        cipherPrivate = null; // this round's secrets are no longer needed
        maskPrivate = null;
        seed = null;
        received = new TreeMap<Integer, byte[]>();
        shareEncryptionKeys.clear();
        return reply("unmask").with("shares", shares).with("undecryptable", undecryptable);
    }

    static byte[] shareAssociatedData(SecAggConfig config, int owner, int holder) {
        return Graph.concat(config.context(), (";share;" + owner + "->" + holder).getBytes(SecAggConfig.UTF8));
    }

    static String shareCommitment(SecAggConfig config, String kind, int owner, int holder, byte[] value) {
        return Crypto.commitment(SHARE_COMMITMENT_BYTES, config.context(), kind.getBytes(SecAggConfig.UTF8),
                SecAggConfig.u32(owner), SecAggConfig.u32(holder), value);
    }

    private void checkSurvivors(Set<Integer> shown) {
        if (!shown.contains(client)) {
            throw new ProtocolViolation("the server lists this client as not survived", "not_a_survivor");
        }
        if (shown.size() < config.minimumSurvivors) {
            throw new ProtocolViolation("only " + shown.size() + " survivors; this client unmasks sums of at least "
                    + config.minimumSurvivors, "too_few_survivors");
        }
    }

    /** Reads every advertised client's nonce; this client's must be there as it drew it; its neighbours follow. */
    private void joinGraph(JSONObject request) {
        nonces = Graph.readAdvertised(base64(request, "advertised"), config.numClients);
        if (!Arrays.equals(nonces.get(client), nonce)) {
            throw new ProtocolViolation("the advertised list the graph is drawn from does not hold this client's nonce",
                    "malformed");
        }
        graphSeed = Graph.graphSeed(config, nonces);
        neighbours.clear();
        for (int neighbour : Graph.neighbours(config, graphSeed, client)) {
            neighbours.add(neighbour);
        }
    }

    private byte[] neighbourSigningKey(int peer, JSONObject entry) {
        byte[] signingPublic = base64(entry, "signing_public_key");
        byte[] signature = base64(entry, "signature");
        if (trustedSigningKeys != null && !trustedSigningKeys.contains(Base64.toBase64String(signingPublic))) {
            throw new ProtocolViolation("client " + peer + "'s signing key is not one of the keys pinned on this device",
                    "bad_signature");
        }
        byte[] payload = Signatures.advertisePayload(config, configDigest, peer, cipherPublicKeys.get(peer),
                maskPublicKeys.get(peer), nonces.get(peer));
        if (!Signatures.verify(signingPublic, signature, payload)) {
            throw new ProtocolViolation("client " + peer + "'s keys do not carry its signature: the server may have "
                    + "replaced them", "bad_signature");
        }
        if (certificates != null) {
            checkCertificate(peer, entry, signingPublic);
        }
        return signingPublic;
    }

    /** Only a key the operator certified for the device the server names, and one seat per device. */
    private void checkCertificate(int peer, JSONObject entry, byte[] signingPublic) {
        String device;
        try {
            device = certificates.verify(entry.opt("certificate"), entry.opt("device_id"), signingPublic,
                    System.currentTimeMillis());
        } catch (DeviceCertificateException refused) {
            throw new ProtocolViolation("client " + peer + "'s signing key is not vouched for by the operator ("
                    + refused.reason() + "): " + refused.getMessage(),
                    refused.reason().equals("revoked") ? "revoked_key" : "uncertified_key");
        }
        Integer seated = neighbourDevices.put(device, peer);
        if (seated != null && seated != peer) {
            throw new ProtocolViolation("the server seated device '" + device + "' twice, as clients " + seated + " and "
                    + peer, "uncertified_key");
        }
    }

    private Json reply(String stageName) {
        return new Json().with("stage", stageName).with("client", client);
    }

    private static int[] sorted(Set<Integer> values) {
        int[] out = new int[values.size()];
        int i = 0;
        for (int value : new TreeSet<Integer>(values)) {
            out[i++] = value;
        }
        return out;
    }

    private static byte[] exchangeKey(JSONObject entry, String field) {
        byte[] key = base64(entry, field);
        if (key.length != Crypto.KEY_BYTES || !Crypto.isUsablePublicKey(key)) {
            throw new ProtocolViolation(field + " must be a usable 32-byte X25519 public key", "malformed");
        }
        return key;
    }

    private static byte[] base64(JSONObject entry, String field) {
        Object value = entry.opt(field);
        if (!(value instanceof String)) {
            throw new ProtocolViolation(field + " is not valid base64", "malformed");
        }
        try {
            return Base64.decode((String) value);
        } catch (RuntimeException notBase64) {
            throw new ProtocolViolation(field + " is not valid base64", "malformed");
        }
    }

    private JSONObject[] listedEntries(JSONObject request, String listName) {
        JSONArray list = request.optJSONArray(listName);
        if (list == null) {
            throw new ProtocolViolation(request.optString("stage") + " needs a list '" + listName + "' of objects",
                    "malformed");
        }
        JSONObject[] entries = new JSONObject[list.length()];
        for (int i = 0; i < entries.length; i++) {
            entries[i] = list.optJSONObject(i);
            if (entries[i] == null) {
                throw new ProtocolViolation(request.optString("stage") + " needs a list '" + listName + "' of objects",
                        "malformed");
            }
        }
        return entries;
    }

    private int[] ids(JSONObject[] entries, String idName) {
        JSONArray values = new JSONArray();
        for (JSONObject entry : entries) {
            values.put(entry.opt(idName));
        }
        Set<Integer> distinct = clientIds(values, idName + "s");
        int[] out = new int[entries.length];
        for (int i = 0; i < entries.length; i++) {
            out[i] = (Integer) entries[i].opt(idName);
        }
        if (distinct.size() != out.length) {
            throw new ProtocolViolation(idName + "s list a client twice", "malformed");
        }
        return out;
    }

    /** A list of distinct client numbers in [0, num_clients), or the message is malformed. */
    private Set<Integer> clientIds(Object values, String what) {
        if (!(values instanceof JSONArray)) {
            throw new ProtocolViolation(what + " must be a list of client numbers", "malformed");
        }
        JSONArray list = (JSONArray) values;
        Set<Integer> ids = new HashSet<Integer>();
        for (int i = 0; i < list.length(); i++) {
            Object value = list.opt(i);
            if (!(value instanceof Integer) || (Integer) value < 0 || (Integer) value >= config.numClients) {
                throw new ProtocolViolation(what + " must be a list of client numbers in [0, " + config.numClients + ")",
                        "malformed");
            }
            ids.add((Integer) value);
        }
        if (ids.size() != list.length()) {
            throw new ProtocolViolation(what + " lists a client twice", "malformed");
        }
        return ids;
    }
}
