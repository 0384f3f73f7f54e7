package dev.fedzoo;

import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

/**
 * A model card as the server sends it (see {@code fedzoo.cards.ModelCard}): read-only accessors for the fields a
 * device acts on, and {@link #json()} for the rest. Built from the JSON, so a field the server adds later is kept.
 */
public final class ModelCard {
    private final JSONObject json;

    /** Wraps a card as the server sent it (needs at least id, sha256 and input). */
    public ModelCard(JSONObject json) {
        if (json == null || !json.has("id") || !json.has("sha256") || !json.has("input")) {
            throw new InvalidInputException("not a model card (needs id, sha256 and input): " + json, "card");
        }
        this.json = json;
    }

    /** The card's JSON (the object itself: do not modify it). */
    public JSONObject json() {
        return json;
    }

    /** The card's id, e.g. {@code mnist-ofa-3}. */
    public String id() {
        return json.optString("id");
    }

    /** The model family (an architecture space; many lines share one). */
    public String family() {
        return json.optString("family");
    }

    /** The model line this version continues (the id of its first version); signed versions never go backwards within one. */
    public String lineId() {
        String line = json.isNull("line") ? null : json.optString("line", null);
        return line == null || line.isEmpty() ? id() : line;
    }

    /** The version within the family (1 when absent). */
    public int version() {
        return json.optInt("version", 1);
    }

    /** What the model does, e.g. {@code mnist}. */
    public String task() {
        return json.optString("task");
    }

    /** The ONNX model blob's size in bytes. */
    public long sizeBytes() {
        return json.optLong("size_bytes");
    }

    /** The sha256 of the ONNX model blob. */
    public String sha256() {
        return json.optString("sha256");
    }

    /** The sha256 of the training graph blob, or null when the model has none. */
    public String trainingGraph() {
        return json.isNull("training_graph") ? null : json.optString("training_graph", null);
    }

    /** Extra blobs by kind (e.g. {@code torch_state} → sha256). */
    public Map<String, String> artifacts() {
        Map<String, String> artifacts = new TreeMap<String, String>();
        JSONObject object = json.optJSONObject("artifacts");
        if (object != null) {
            for (Iterator<String> keys = object.keys(); keys.hasNext();) {
                String kind = keys.next();
                artifacts.put(kind, object.optString(kind));
            }
        }
        return artifacts;
    }

    /** The name of the model's single input. */
    public String inputName() {
        return json.optJSONObject("input").optString("name");
    }

    /** The input's shape; the symbolic batch dimension (a string) reads as -1. */
    public long[] inputShape() {
        JSONArray shape = json.optJSONObject("input").optJSONArray("shape");
        long[] dims = new long[shape == null ? 0 : shape.length()];
        for (int i = 0; i < dims.length; i++) {
            dims[i] = shape.opt(i) instanceof Number ? ((Number) shape.opt(i)).longValue() : -1;
        }
        return dims;
    }

    /** The per-channel means of the card's {@code (x - mean) / std}, or null without normalisation. */
    public float[] normalisationMean() {
        return normalisation("mean");
    }

    /** The per-channel standard deviations of the card's normalisation, or null without one. */
    public float[] normalisationStd() {
        return normalisation("std");
    }

    private float[] normalisation(String key) {
        JSONObject normalisation = json.optJSONObject("input").optJSONObject("normalisation");
        if (normalisation == null) {
            return null;
        }
        try {
            JSONArray values = normalisation.getJSONArray(key);
            float[] out = new float[values.length()];
            for (int i = 0; i < out.length; i++) {
                out[i] = (float) values.getDouble(i);
            }
            return out;
        } catch (JSONException error) {
            throw new InvalidInputException("card normalisation has no list '" + key + "'", "input.normalisation");
        }
    }

    /** The class labels, by output index. */
    public List<String> labels() {
        JSONArray labels = json.optJSONArray("labels");
        List<String> out = new ArrayList<String>();
        for (int i = 0; labels != null && i < labels.length(); i++) {
            out.add(labels.optString(i));
        }
        return Collections.unmodifiableList(out);
    }

    /** The held-out accuracy the card reports, or NaN. */
    public double accuracy() {
        JSONObject metrics = json.optJSONObject("metrics");
        return metrics == null ? Double.NaN : metrics.optDouble("accuracy");
    }

    /** The card's signature block ({@code key_id}, {@code algorithm}, {@code payload}, {@code signature}), or null. */
    public JSONObject signature() {
        return json.optJSONObject("signature");
    }

    @Override
    public String toString() {
        return "ModelCard(" + id() + ")";
    }
}
