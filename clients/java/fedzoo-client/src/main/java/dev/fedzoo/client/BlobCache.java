package dev.fedzoo.client;

import java.io.File;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.HttpURLConnection;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HashMap;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import dev.fedzoo.FedzooException;
import dev.fedzoo.InvalidInputException;

/**
 * Verified blobs on disk by sha256, plus the partial files of interrupted downloads, as
 * {@code fedzoo.clients.download}: {@code <root>/blobs/<sha256>} holds verified blobs,
 * {@code <root>/partial/<sha256>.part} the bytes of an interrupted download, which the next attempt continues
 * with {@code Range: bytes=<have>-} and {@code If-Range: "<sha256>"} (a server that would send other bytes sends
 * the whole blob instead). A blob moves into {@code blobs/} only once its bytes hash to the expected sha256.
 * Partial files survive process death, so an app killed mid-download resumes where it stopped.
 */
public final class BlobCache {
    private static final Pattern SHA256 = Pattern.compile("[0-9a-f]{64}");
    private static final Pattern CONTENT_RANGE = Pattern.compile("bytes (\\d+)-(\\d+)/(\\d+|\\*)");

    private final File root;

    /** A cache under {@code root} (created if missing). */
    public BlobCache(File root) {
        this.root = root;
        mkdirs(new File(root, "blobs"));
        mkdirs(new File(root, "partial"));
    }

    /** A blob's verified path and how many bytes this call transferred (0 when it was cached). */
    public static final class Fetched {
        public final File path;
        public final long transferredBytes;

        Fetched(File path, long transferredBytes) {
            this.path = path;
            this.transferredBytes = transferredBytes;
        }
    }

    /** The cache's directory. */
    public File root() {
        return root;
    }

    /** Where the verified blob {@code sha256} lives (whether or not it is there yet). */
    public File blobPath(String sha256) {
        return new File(new File(root, "blobs"), check(sha256));
    }

    /** Where an interrupted download of {@code sha256} keeps its bytes. */
    public File partialPath(String sha256) {
        return new File(new File(root, "partial"), check(sha256) + ".part");
    }

    /** The cached blob, or null when it is not cached. */
    public File get(String sha256) {
        File path = blobPath(sha256);
        return path.isFile() ? path : null;
    }

    /**
     * The verified blob at {@code urlPath} (expected to hash to {@code sha256}): from the cache, or downloaded,
     * resuming an interrupted transfer up to {@code maxAttempts} times. 429 and 503 answers wait as the
     * server's {@code Retry-After} says; any other error status raises its {@link ApiException}.
     */
    public Fetched fetch(FedzooHttp http, String urlPath, String sha256, int maxAttempts) {
        File cached = get(sha256);
        if (cached != null) {
            return new Fetched(cached, 0);
        }
        File partial = partialPath(sha256);
        long transferred = 0;
        String lastProblem = "";
        boolean complete = false;
        for (int attempt = 0; attempt < maxAttempts && !complete; attempt++) {
            long have = partial.isFile() ? partial.length() : 0;
            Map<String, String> headers = new HashMap<String, String>();
            // identity encoding: byte offsets must be offsets into the blob, not into a compressed stream
            headers.put("Accept-Encoding", "identity");
            if (have > 0) {
                headers.put("Range", "bytes=" + have + "-");
                headers.put("If-Range", "\"" + sha256 + "\"");
            }
            Double retryAfterS = null;
            HttpURLConnection connection = null;
            try {
                connection = http.open("GET", urlPath, headers);
                int status = connection.getResponseCode();
                if (status == 416) {
                    deleteQuietly(partial); // we hold bytes past the blob's end: start over
                    lastProblem = "HTTP 416";
                    continue;
                }
                if (status == 429 || status == 503) {
                    lastProblem = "HTTP " + status;
                    retryAfterS = FedzooHttp.retryAfterS(connection.getHeaderField("Retry-After"));
                } else if (status >= 400) {
                    throw ApiException.forResponse(status, new String(FedzooHttp.readAll(connection.getErrorStream()),
                            FedzooHttp.UTF8));
                } else {
                    boolean append = status == 206 && rangeStart(connection.getHeaderField("Content-Range")) == have;
                    long expectedLength = connection.getContentLengthLong();
                    long received = copy(connection.getInputStream(), partial, append);
                    transferred += received;
                    if (expectedLength >= 0 && received < expectedLength) {
                        lastProblem = "the connection ended after " + received + " of " + expectedLength + " bytes";
                    } else {
                        complete = true;
                    }
                }
            } catch (IOException error) {
                lastProblem = error.getClass().getSimpleName() + ": " + error.getMessage();
            } finally {
                if (connection != null) {
                    connection.disconnect();
                }
            }
            if (!complete && attempt + 1 < maxAttempts) {
                http.sleepS(http.delayS(attempt, retryAfterS));
            }
        }
        if (!complete) {
            throw new ServerUnavailableException("download of " + urlPath + " did not finish after " + maxAttempts
                    + " attempts; last problem: " + lastProblem);
        }
        String actual = sha256Of(partial);
        if (!actual.equals(sha256)) {
            deleteQuietly(partial);
            throw new IntegrityException(urlPath + " sent bytes hashing to " + actual + ", not the expected " + sha256
                    + "; download discarded");
        }
        File target = blobPath(sha256);
        if (!partial.renameTo(target)) {
            throw new FedzooException("cannot move " + partial + " to " + target);
        }
        return new Fetched(target, transferred);
    }

    /** Lowercase hex sha256 of a file's bytes. */
    public static String sha256Of(File file) {
        MessageDigest digest = sha256Digest();
        try {
            InputStream in = new FileInputStream(file);
            try {
                byte[] chunk = new byte[1 << 16];
                for (int read = in.read(chunk); read > 0; read = in.read(chunk)) {
                    digest.update(chunk, 0, read);
                }
            } finally {
                in.close();
            }
        } catch (IOException error) {
            throw new FedzooException("cannot read " + file + ": " + error.getMessage(), error);
        }
        return hex(digest.digest());
    }

    /** A whole file's bytes (models and training graphs are small enough to hold in memory on a device). */
    public static byte[] readBytes(File file) {
        try {
            return FedzooHttp.readAll(new FileInputStream(file));
        } catch (IOException error) {
            throw new FedzooException("cannot read " + file + ": " + error.getMessage(), error);
        }
    }

    /** Lowercase hex sha256 of {@code data}. */
    public static String sha256Of(byte[] data) {
        return hex(sha256Digest().digest(data));
    }

    static MessageDigest sha256Digest() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException impossible) {
            throw new IllegalStateException("every Java platform has SHA-256", impossible);
        }
    }

    static String hex(byte[] bytes) {
        StringBuilder out = new StringBuilder(bytes.length * 2);
        for (byte b : bytes) {
            out.append(Character.forDigit((b >> 4) & 0xF, 16)).append(Character.forDigit(b & 0xF, 16));
        }
        return out.toString();
    }

    /** Copies {@code in} to {@code target} as it arrives, so a cut keeps what arrived; returns the bytes copied. */
    private static long copy(InputStream in, File target, boolean append) throws IOException {
        OutputStream out = new FileOutputStream(target, append);
        long copied = 0;
        try {
            byte[] chunk = new byte[1 << 16];
            for (int read = in.read(chunk); read > 0; read = in.read(chunk)) {
                out.write(chunk, 0, read);
                copied += read;
            }
        } catch (IOException cut) {
            out.close();
            throw new IOException(cut.getMessage() + " (" + copied + " bytes kept for resuming)", cut);
        } finally {
            out.close();
            in.close();
        }
        return copied;
    }

    private static long rangeStart(String contentRange) {
        Matcher match = CONTENT_RANGE.matcher(contentRange == null ? "" : contentRange);
        return match.matches() ? Long.parseLong(match.group(1)) : -1;
    }

    private static String check(String sha256) {
        if (sha256 == null || !SHA256.matcher(sha256).matches()) {
            throw new InvalidInputException("sha256 must be 64 lowercase hex digits, got '" + sha256 + "'", "sha256");
        }
        return sha256;
    }

    static void mkdirs(File directory) {
        if (!directory.isDirectory() && !directory.mkdirs()) {
            throw new FedzooException("cannot create directory " + directory);
        }
    }

    static void deleteQuietly(File file) {
        if (file.exists() && !file.delete()) {
            file.deleteOnExit();
        }
    }
}
