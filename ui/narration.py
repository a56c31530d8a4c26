"""One round told in the lesson's order, in English and Chinese, for a teacher stepping through it.

The order is the lesson's (shared/seeds, the lesson on why speculative decoding works): why checking K tokens
costs about one forward here, where the draft came from, verification in one forward, the longest agreeing
prefix kept, the target's own token added, and the rejected tail cut from the KV cache. Every number comes
from the round's event and this machine's measured forward (engine/cost/roofline.py).
"""

from __future__ import annotations

import html

# where a drafter's guess comes from, by the start of its type name: (English, Chinese)
SOURCES = (
    ("ngram", "copied from earlier text: the last tokens matched a place in the prompt or the answer, and what "
              "followed there is proposed", "从前文复制:最后几个 token 在提示或回答里出现过,就把那里后面的内容当作草稿"),
    ("draft-head", "a small head reading the target's own hidden states guessed the next tokens",
     "一个读取目标模型隐藏状态的小草稿头猜出了接下来的 token"),
    ("draft-eagle3", "an EAGLE-3 head reading the target's features from three layers guessed them",
     "EAGLE-3 草稿头读取目标模型三层特征后猜出了它们"),
    ("draft-mtp", "the target's own multi-token-prediction layers, fed its last hidden state, guessed them",
     "目标模型自带的多 token 预测层读取它最后的隐藏状态后猜出了它们"),
    ("draft-dflash", "a block drafter reading the target's features guessed the whole block in one pass",
     "块草稿器读取目标模型的特征,一次前向猜出了整块 token"),
    ("draft-dspark", "a block drafter reading the target's features guessed the whole block in one pass, each "
                     "token conditioned on the one before it",
     "块草稿器读取目标模型的特征,一次前向猜出了整块 token,每个 token 以前一个为条件"),
    ("draft-simple", "a smaller draft model of the same vocabulary generated them one by one",
     "同词表的小草稿模型逐个生成了它们"),
    ("draft-uni", "a draft model of another vocabulary wrote text, re-tokenised for the target",
     "另一套词表的草稿模型先写出文本,再按目标模型的词表重新切分"),
    ("grammar", "the output format forces them: only one token is allowed at each of these places",
     "输出格式强制了它们:这些位置上只允许一个 token"),
    ("oracle", "the known answer was proposed (a measurement's ceiling)", "直接提出已知答案(测量用的上限)"),
)


def source_of(drafter: str | None) -> tuple[str, str]:
    for prefix, en, zh in SOURCES:
        if drafter and drafter.startswith(prefix):
            return en, zh
    return "the drafter proposed them", "草稿器提出了它们"


def cost_words(rows: int, roof) -> tuple[str, str]:
    """Why verifying `rows` rows costs about one forward here, or how much more."""
    if roof is None or not roof.rows:
        return (f"The target checks all {rows} rows in one forward.", f"目标模型在一次前向里检查全部 {rows} 行。")
    r = roof.ratio(rows)
    return (f"The target checks all {rows} rows in one forward, which on this machine costs {r:.2f}&times; a "
            f"forward of one row: the weights are read once for every row.",
            f"目标模型在一次前向里检查全部 {rows} 行;在这台机器上它的耗时是单行前向的 {r:.2f} 倍:"
            f"权重只读一遍,所有行共用。")


def steps(ev, roof) -> list[tuple[str, str]]:
    """(English, Chinese) of each step of one drafted round."""
    k, m = len(ev.drafted), ev.n_accepted
    src_en, src_zh = source_of(ev.drafter)
    cost_en, cost_zh = cost_words(k + 1, roof)
    own = "bonus" if m == k else "correction"
    own_zh = "奖励 token(bonus)" if m == k else "纠正 token"
    if ev.rm_range is not None:
        a, b = ev.rm_range
        cut = (f"The {b - a} rejected token(s) leave the KV cache: <code>seq_rm(seq {ev.seq}, {a}, -1)</code> frees "
               f"cells [{a}, {b}), and the next round starts right after the kept ones.",
               f"被拒绝的 {b - a} 个 token 从 KV 缓存中删除:<code>seq_rm(seq {ev.seq}, {a}, -1)</code> 释放位置 "
               f"[{a}, {b}),下一轮从保留的 token 之后继续。")
    elif ev.rollback == "checkpoint":
        cut = ("This memory cannot drop a tail, so the state saved before drafting is restored and the kept tokens "
               "are replayed.", "这种记忆无法直接删除尾部,于是恢复起草前保存的状态,再重放保留的 token。")
    else:
        cut = ("Nothing to cut: every drafted token was kept.", "无需回滚:所有草稿 token 都被接受。")
    return [
        (f"<b>Draft.</b> {k} token(s) from {html.escape(ev.drafter or 'a drafter')}: {src_en}.",
         f"<b>起草。</b>{html.escape(ev.drafter or '草稿器')} 提出 {k} 个 token:{src_zh}。"),
        (f"<b>Verify.</b> {cost_en}", f"<b>验证。</b>{cost_zh}"),
        (f"<b>Accept.</b> The target agrees with the first {m} of them: the longest agreeing prefix is kept.",
         f"<b>接受。</b>目标模型认可前 {m} 个:保留最长的一致前缀。"),
        (f"<b>Its own token.</b> At row {m} the target's own choice is added as the {own}, so every round gives "
         f"at least one token, exactly as plain decoding would.",
         f"<b>目标自己的 token。</b>第 {m} 行由目标模型自己采样,作为{own_zh}加入,所以每轮至少产出一个 token,"
         f"与普通解码完全一致。"),
        (f"<b>Cut the cache.</b> {cut[0]}", f"<b>裁剪缓存。</b>{cut[1]}"),
    ]


def narration_html(ev, roof) -> str:
    """The round told step by step, English first, Chinese under it; empty for rounds without a draft."""
    if ev is None or not ev.drafted or ev.kind != "spec":
        return ""
    told = steps(ev, roof)
    total = len(ev.emitted)
    en = "".join(f"<li>{e}</li>" for e, _ in told)
    zh = "".join(f"<li>{z}</li>" for _, z in told)
    return (f'<div class="narration"><p><b>This round in the lesson\'s order</b>: {total} token(s) for one '
            f"forward.</p><ol>{en}</ol><details><summary>中文</summary><p><b>按课程顺序讲解本轮</b>:一次前向得到 "
            f"{total} 个 token。</p><ol>{zh}</ol></details></div>")
