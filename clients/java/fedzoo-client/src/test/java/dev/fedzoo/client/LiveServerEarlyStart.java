package dev.fedzoo.client;

import org.junit.platform.engine.TestSource;
import org.junit.platform.engine.support.descriptor.ClassSource;
import org.junit.platform.launcher.TestExecutionListener;
import org.junit.platform.launcher.TestIdentifier;
import org.junit.platform.launcher.TestPlan;

import dev.fedzoo.LiveServer;

/**
 * When a test run includes {@link LiveServerTest}, starts its Python harness as the run begins (registered in
 * {@code META-INF/services}), so that the harness's start overlaps the tests that run before it instead of adding
 * to the build's time; a harness no test took is stopped when the run ends.
 */
public final class LiveServerEarlyStart implements TestExecutionListener {
    @Override
    public void testPlanExecutionStarted(TestPlan plan) {
        for (TestIdentifier root : plan.getRoots()) {
            for (TestIdentifier test : plan.getDescendants(root)) {
                if (isLiveServerTest(test.getSource().orElse(null))) {
                    LiveServer.startInBackground();
                    return;
                }
            }
        }
    }

    @Override
    public void testPlanExecutionFinished(TestPlan plan) {
        LiveServer.closeUnused();
    }

    private static boolean isLiveServerTest(TestSource source) {
        return source instanceof ClassSource && ((ClassSource) source).getClassName().equals(LiveServerTest.class.getName());
    }
}
