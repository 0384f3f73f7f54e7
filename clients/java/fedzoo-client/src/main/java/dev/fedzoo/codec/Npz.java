package dev.fedzoo.codec;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.zip.CRC32;
import java.util.zip.ZipEntry;
import java.util.zip.ZipInputStream;
import java.util.zip.ZipOutputStream;

import dev.fedzoo.InvalidInputException;

/**
 * numpy's {@code .npz}: a zip archive of {@code <key>.npy} members, stored ({@code np.savez}) or deflated
 * ({@code np.savez_compressed}).
 */
public final class Npz {
    private static final String SUFFIX = ".npy";

    private Npz() {
    }

    /** An archive of the given {@code .npy} members (key → bytes, in order), deflated or stored. */
    public static byte[] write(Map<String, byte[]> members, boolean compressed) {
        ByteArrayOutputStream buffer = new ByteArrayOutputStream();
        try {
            ZipOutputStream zip = new ZipOutputStream(buffer);
            for (Map.Entry<String, byte[]> member : members.entrySet()) {
                ZipEntry entry = new ZipEntry(member.getKey() + SUFFIX);
                byte[] bytes = member.getValue();
                if (compressed) {
                    entry.setMethod(ZipEntry.DEFLATED);
                } else {
                    // a stored member needs its size and checksum up front
                    CRC32 crc = new CRC32();
                    crc.update(bytes);
                    entry.setMethod(ZipEntry.STORED);
                    entry.setSize(bytes.length);
                    entry.setCompressedSize(bytes.length);
                    entry.setCrc(crc.getValue());
                }
                zip.putNextEntry(entry);
                zip.write(bytes);
                zip.closeEntry();
            }
            zip.close();
        } catch (IOException error) {
            throw new IllegalStateException("writing to memory failed", error);
        }
        return buffer.toByteArray();
    }

    /** Every member of an archive, by key (the member name without {@code .npy}). */
    public static Map<String, Npy.Array> read(byte[] archive) {
        Map<String, Npy.Array> arrays = new LinkedHashMap<String, Npy.Array>();
        try {
            ZipInputStream zip = new ZipInputStream(new ByteArrayInputStream(archive));
            byte[] chunk = new byte[1 << 16];
            for (ZipEntry entry = zip.getNextEntry(); entry != null; entry = zip.getNextEntry()) {
                ByteArrayOutputStream member = new ByteArrayOutputStream();
                for (int read = zip.read(chunk); read > 0; read = zip.read(chunk)) {
                    member.write(chunk, 0, read);
                }
                String name = entry.getName();
                String key = name.endsWith(SUFFIX) ? name.substring(0, name.length() - SUFFIX.length()) : name;
                arrays.put(key, Npy.read(member.toByteArray()));
            }
            zip.close();
        } catch (IOException error) {
            throw new InvalidInputException("not a readable .npz archive: " + error.getMessage(), "delta");
        }
        if (arrays.isEmpty()) {
            throw new InvalidInputException("not a .npz archive (no members)", "delta");
        }
        return arrays;
    }
}
