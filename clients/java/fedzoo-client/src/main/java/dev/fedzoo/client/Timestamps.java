package dev.fedzoo.client;

import java.text.SimpleDateFormat;
import java.util.Calendar;
import java.util.Date;
import java.util.Locale;
import java.util.TimeZone;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import dev.fedzoo.InvalidInputException;

/**
 * The server's ISO-8601 timestamps ({@code 2026-12-04T18:00:00.123456+00:00}, {@code ...Z}) as epoch
 * milliseconds. Written by hand because {@code java.time} needs Android API 26.
 */
public final class Timestamps {
    private static final Pattern ISO = Pattern.compile(
            "(\\d{4})-(\\d{2})-(\\d{2})[T ](\\d{2}):(\\d{2}):(\\d{2})(?:\\.(\\d+))?(Z|[+-]\\d{2}:?\\d{2})?");

    private Timestamps() {
    }

    /** Milliseconds since the epoch of an ISO-8601 timestamp (UTC when it names no offset). */
    public static long parseMillis(String text) {
        Matcher match = ISO.matcher(text == null ? "" : text.trim());
        if (!match.matches()) {
            throw new InvalidInputException("not an ISO-8601 timestamp: '" + text + "'", "timestamp");
        }
        Calendar calendar = Calendar.getInstance(TimeZone.getTimeZone("UTC"), Locale.ROOT);
        calendar.clear();
        calendar.set(Integer.parseInt(match.group(1)), Integer.parseInt(match.group(2)) - 1, Integer.parseInt(match.group(3)),
                Integer.parseInt(match.group(4)), Integer.parseInt(match.group(5)), Integer.parseInt(match.group(6)));
        long millis = calendar.getTimeInMillis();
        String fraction = match.group(7);
        if (fraction != null) {
            millis += Long.parseLong((fraction + "00").substring(0, 3));
        }
        String offset = match.group(8);
        if (offset != null && !offset.equals("Z")) {
            String digits = offset.replace(":", "");
            int minutes = Integer.parseInt(digits.substring(1, 3)) * 60 + Integer.parseInt(digits.substring(3, 5));
            millis -= (offset.charAt(0) == '-' ? -1 : 1) * minutes * 60_000L;
        }
        return millis;
    }

    /** {@code YYYY-MM-DDTHH:MM:SSZ} in UTC, whole seconds (the signed cards' format). */
    public static String formatSeconds(long millis) {
        SimpleDateFormat format = new SimpleDateFormat("yyyy-MM-dd'T'HH:mm:ss'Z'", Locale.ROOT);
        format.setTimeZone(TimeZone.getTimeZone("UTC"));
        return format.format(new Date(Math.floorDiv(millis, 1000L) * 1000L));
    }
}
