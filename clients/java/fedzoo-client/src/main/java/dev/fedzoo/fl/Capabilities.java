package dev.fedzoo.fl;

import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * What a device says it can do when it checks in, as {@code fedzoo.capabilities}: the server selects it only for
 * rounds whose plan needs no more (a private plan needs its SecAgg+ protocol version and, under DP, clipping; with
 * adaptive clipping under SecAgg+, the unclipped bit in the masked vector). A device that declares nothing is selected
 * for plain rounds only.
 */
public final class Capabilities {
    /** The SecAgg+ protocol version this SDK speaks ({@code fedzoo.capabilities.SECURE_AGGREGATION_VERSION}). */
    public static final int SECURE_AGGREGATION_VERSION = 3;

    /** What this SDK can do: SecAgg+ (this version), DP clipping, fp32 and int8 updates, the unclipped bit. */
    public static final Capabilities JAVA_SDK = new Capabilities(SECURE_AGGREGATION_VERSION, true,
            Arrays.asList("fp32", "int8"), true);

    /** The SecAgg+ protocol version spoken, or null for none. */
    public final Integer secureAggregation;
    /** Whether the device clips its delta to a DP round's clip norm. */
    public final boolean dpClipping;
    /** The update encodings it can upload, or null (not said). */
    public final List<String> encodings;
    /** Whether, under SecAgg+, it appends its "not clipped" bit to the vector it masks (adaptive clipping). */
    public final boolean unclippedBit;

    /** Declared capabilities; see the fields. */
    public Capabilities(Integer secureAggregation, boolean dpClipping, List<String> encodings, boolean unclippedBit) {
        this.secureAggregation = secureAggregation;
        this.dpClipping = dpClipping;
        this.encodings = encodings == null ? null : Collections.unmodifiableList(encodings);
        this.unclippedBit = unclippedBit;
    }

    /** Declared capabilities without the unclipped bit. */
    public Capabilities(Integer secureAggregation, boolean dpClipping, List<String> encodings) {
        this(secureAggregation, dpClipping, encodings, false);
    }

    /** The check-in's query parameters that declare these capabilities. */
    public Map<String, String> toQuery() {
        Map<String, String> query = new LinkedHashMap<String, String>();
        if (secureAggregation != null) {
            query.put("secure_aggregation", secureAggregation.toString());
        }
        if (dpClipping) {
            query.put("dp_clipping", "true");
        }
        if (encodings != null) {
            StringBuilder joined = new StringBuilder();
            for (String encoding : encodings) {
                joined.append(joined.length() == 0 ? "" : ",").append(encoding);
            }
            query.put("encodings", joined.toString());
        }
        if (unclippedBit) {
            query.put("unclipped_bit", "true");
        }
        return query;
    }
}
