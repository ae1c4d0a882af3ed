/**
 * {@link KimiKernels} on @specd/native (native/src/kda*, mla*, moe*): the C++ kernels with the same
 * layouts and determinism contract (see those modules' comments).
 */

import {
  createMoeExpertSet,
  kdaChunked,
  kdaGate,
  kdaRecurrent,
  mlaAttention,
  moeExperts,
  moeRoute,
  prepareMlaWeights,
  type MlaWeights,
  type MoeExpertSet,
  type MoeExpertWeights,
} from '@specd/native';

import type { KimiKernels, MlaPrepared, MoePrepared, SwigluWeights } from './kernels.js';

interface NativeMla extends MlaPrepared {
  readonly kind: 'native';
  readonly w: MlaWeights;
}

interface NativeMoe extends MoePrepared {
  readonly kind: 'native';
  readonly set: MoeExpertSet;
}

/** Native kernels (`'chunked'` KDA uses the WY form with chunks of 64 tokens). */
export const nativeKernels: KimiKernels = Object.freeze<KimiKernels>({
  name: 'native',
  kda(call, mode) {
    const inputs = { qkv: call.qkv, g: call.g, beta: call.beta, convWeight: call.convWeight };
    const batch = { seqLens: call.seqLens, slots: call.slots };
    const pools = { state: call.state, conv: call.conv };
    const shape = { heads: call.heads, headDim: call.headDim };
    if (mode === 'chunked') kdaChunked(inputs, batch, pools, shape, { out: call.out, chunk: 64 });
    else
      kdaRecurrent(inputs, batch, pools, shape, {
        out: call.out,
        snapshots: call.snapshots,
        initial: call.initial,
        keepBefore: call.keepBefore,
      });
  },
  kdaGate(f, dtBias, negA, b, bOffset, bStride, heads, headDim) {
    return kdaGate(f, dtBias, negA, b, { heads, headDim }, { offset: bOffset, stride: bStride });
  },
  prepareMla(kvB, c) {
    const w = prepareMlaWeights(kvB, {
      numHeads: c.numHeads,
      qkNopeHeadDim: c.qkNopeHeadDim,
      qkRopeHeadDim: c.qkRopeHeadDim,
      vHeadDim: c.vHeadDim,
      kvLoraRank: c.kvLoraRank,
    });
    return { kind: 'native', w } as NativeMla;
  },
  mla(q, pool, pageSize, prepared, batch, scale) {
    return mlaAttention(q, pool, pageSize, (prepared as NativeMla).w, batch, { scale, mask: 'causal' });
  },
  route(logits, n, bias, c) {
    return moeRoute(logits, n, c.numExperts, c.expertsPerToken, c.routedScalingFactor, {
      bias,
      renormalize: c.moeRenormalize,
    });
  },
  prepareMoe(experts, shared) {
    const pack = (s: SwigluWeights): MoeExpertWeights => ({ w13: s.gateUp, w2: s.down });
    const set = createMoeExpertSet(experts.map(pack), shared === undefined ? undefined : pack(shared));
    return { kind: 'native', set } as NativeMoe;
  },
  moe(x, n, prepared, r, out) {
    return moeExperts(x, n, (prepared as NativeMoe).set, r, out);
  },
});
